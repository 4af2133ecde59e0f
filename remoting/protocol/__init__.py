"""Typed schemas of the RocketMQ protocol: custom headers (`headers`), route bodies (`route`)
and client/broker JSON bodies (`bodies`). Data only: no IO.

The header classes are re-exported here; import bodies from their modules
(`remoting.protocol.route`, `remoting.protocol.bodies`).
"""

from remoting.protocol.headers import (
    CheckTransactionStateRequestHeader,
    ConsumerSendMsgBackRequestHeader,
    CreateTopicRequestHeader,
    DeleteTopicFromNamesrvRequestHeader,
    DeleteTopicRequestHeader,
    EndTransactionRequestHeader,
    GetConsumerConnectionListRequestHeader,
    GetConsumerListByGroupRequestHeader,
    GetConsumeStatsRequestHeader,
    GetEarliestMsgStoretimeRequestHeader,
    GetEarliestMsgStoretimeResponseHeader,
    GetMaxOffsetRequestHeader,
    GetMaxOffsetResponseHeader,
    GetMinOffsetRequestHeader,
    GetMinOffsetResponseHeader,
    GetRouteInfoRequestHeader,
    GetTopicsByClusterRequestHeader,
    GetTopicStatsInfoRequestHeader,
    NotifyConsumerIdsChangedRequestHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    QueryConsumerOffsetRequestHeader,
    QueryConsumerOffsetResponseHeader,
    QueryDataVersionRequestHeader,
    QueryDataVersionResponseHeader,
    QueryMessageRequestHeader,
    QueryMessageResponseHeader,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    ResetOffsetRequestHeader,
    SearchOffsetRequestHeader,
    SearchOffsetResponseHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    UnRegisterBrokerRequestHeader,
    UnregisterClientRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    ViewMessageRequestHeader,
)
