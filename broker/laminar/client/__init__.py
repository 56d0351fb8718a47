"""Python client of a Laminar cluster: async client, producer, consumer, sync wrapper.

```python
from laminar.client import AsyncClient, Consumer, Producer

async with AsyncClient(["http://127.0.0.1:9001"]) as client:
    await client.create_topic("orders", partitions=6)
    async with Producer(client, "orders") as producer:
        sent = await producer.send(b"hello", key=b"customer-1")
    print(await sent)  # RecordMetadata(partition=..., index=...)
    async with Consumer(client, "orders") as consumer:
        async for partition, record in consumer:
            ...
    async with GroupConsumer(client, "orders", "billing") as queue:  # a shared queue
        await queue.run(handle, concurrency=8)  # returns: accept; raises: reject

with Client(["http://127.0.0.1:9001"]) as client:  # blocking, for threads and scripts
    with client.consumer("orders", consumer_timeout_ms=1000) as consumer:
        for partition, record in consumer:  # ends after 1 s without a record
            ...
    with client.group_consumer("orders", "billing") as queue:
        queue.run(handle_in_a_thread, concurrency=8)
```
"""

from laminar.log.batch import Record, StoredRecord

from .client import AsyncClient, check_consumer, check_group, decode_read_body, read_replicas
from .config import ClientConfigError
from .consumer import Consumer, ConsumerTransport
from .errors import (
    BadRequest,
    Conflict,
    CorruptData,
    Forbidden,
    LaminarError,
    NotFound,
    OutOfRange,
    Overloaded,
    PayloadTooLarge,
    Timeout,
    Unauthorized,
    Unavailable,
    error_from_response,
)
from .group import Delivery, GroupConsumer, GroupTransport, Retry, default_consumer_id
from .models import (
    Acquired,
    AppendResult,
    ClusterInfo,
    GroupDescription,
    HostedPartition,
    Member,
    NodeAdminState,
    NodePartitions,
    NodeTls,
    PartitionState,
    QueueMessage,
    ReadResult,
    RecordMetadata,
    Settled,
    TopicDescription,
    TopicInfo,
)
from .partitioner import StickyPartitioner, key_hash, partition_for
from .producer import Producer, ProducerTransport
from .sync import Client, SyncProducer
from .sync_consumers import SyncConsumer, SyncDelivery, SyncGroupConsumer
from .transactions import Transaction, TransactionalProducer

__all__ = [
    "Acquired",
    "AppendResult",
    "AsyncClient",
    "BadRequest",
    "Client",
    "ClientConfigError",
    "ClusterInfo",
    "Conflict",
    "Consumer",
    "ConsumerTransport",
    "CorruptData",
    "Delivery",
    "Forbidden",
    "GroupConsumer",
    "GroupDescription",
    "GroupTransport",
    "HostedPartition",
    "LaminarError",
    "Member",
    "NodeAdminState",
    "NodePartitions",
    "NodeTls",
    "NotFound",
    "OutOfRange",
    "Overloaded",
    "PartitionState",
    "PayloadTooLarge",
    "Producer",
    "ProducerTransport",
    "QueueMessage",
    "ReadResult",
    "Record",
    "RecordMetadata",
    "Retry",
    "Settled",
    "StickyPartitioner",
    "StoredRecord",
    "SyncConsumer",
    "SyncDelivery",
    "SyncGroupConsumer",
    "SyncProducer",
    "Timeout",
    "TopicDescription",
    "TopicInfo",
    "Transaction",
    "TransactionalProducer",
    "Unauthorized",
    "Unavailable",
    "check_consumer",
    "check_group",
    "decode_read_body",
    "default_consumer_id",
    "error_from_response",
    "key_hash",
    "partition_for",
    "read_replicas",
]
