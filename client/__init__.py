"""trimq client library: producers, push and lite-pull consumers, admin.

Trio-native; `client.sync` offers the same objects to threaded code.
Importing this package never imports pyspark.
"""

from client.admin import Admin
from client.config import ClientConfig
from client.consumer._base import ConsumeFromWhere, MessageModel
from client.consumer.pull import PullConsumer
from client.consumer.push import (
    ConsumeConcurrentlyContext,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    PushConsumer,
)
from client.errors import (
    ClientClosedError,
    MessageValidationError,
    MQClientError,
    NoRouteError,
    SendFailedError,
)
from client.filter import MessageSelector
from client.instance import ClientInstance
from client.message import Message, MessageExt, MessageQueue, SendResult, SendStatus
from client.producer import Producer
from client.request_reply import RequestTimeoutError, create_reply_message
from client.transaction import LocalTransactionState, TransactionProducer, TransactionSendResult

__all__ = [
    "Admin",
    "ClientClosedError",
    "ClientConfig",
    "ClientInstance",
    "ConsumeConcurrentlyContext",
    "ConsumeFromWhere",
    "ConsumeOrderlyContext",
    "ConsumeOrderlyStatus",
    "ConsumeStatus",
    "LocalTransactionState",
    "MQClientError",
    "Message",
    "MessageExt",
    "MessageModel",
    "MessageQueue",
    "MessageSelector",
    "MessageValidationError",
    "NoRouteError",
    "Producer",
    "PullConsumer",
    "PushConsumer",
    "RequestTimeoutError",
    "SendFailedError",
    "SendResult",
    "SendStatus",
    "TransactionProducer",
    "TransactionSendResult",
    "create_reply_message",
]
