"""The blocking client (`client.sync`): same names as `client`, methods that block.

See `client.blocking` for how it works.
"""

from client.blocking import Admin, Producer, PullConsumer, PushConsumer
from client.config import ClientConfig
from client.consumer._base import ConsumeFromWhere, MessageModel
from client.consumer.push import ConsumeStatus
from client.message import Message, MessageExt, MessageQueue, SendResult, SendStatus
from client.request_reply import RequestTimeoutError, create_reply_message

__all__ = [
    "Admin",
    "ClientConfig",
    "ConsumeFromWhere",
    "ConsumeStatus",
    "Message",
    "MessageExt",
    "MessageModel",
    "MessageQueue",
    "Producer",
    "PullConsumer",
    "PushConsumer",
    "RequestTimeoutError",
    "SendResult",
    "SendStatus",
    "create_reply_message",
]
