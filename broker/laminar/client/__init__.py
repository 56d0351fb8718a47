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
```
"""

from laminar.log.batch import Record, StoredRecord

from .client import AsyncClient, decode_read_body, read_replicas
from .consumer import Consumer, ConsumerTransport
from .errors import (
    BadRequest,
    Conflict,
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
from .models import (
    AppendResult,
    ClusterInfo,
    HostedPartition,
    Member,
    NodeAdminState,
    NodePartitions,
    PartitionState,
    ReadResult,
    RecordMetadata,
    TopicDescription,
    TopicInfo,
)
from .partitioner import StickyPartitioner, key_hash, partition_for
from .producer import Producer, ProducerTransport
from .sync import Client, SyncProducer

__all__ = [
    "AppendResult",
    "AsyncClient",
    "BadRequest",
    "Client",
    "ClusterInfo",
    "Conflict",
    "Consumer",
    "ConsumerTransport",
    "HostedPartition",
    "LaminarError",
    "Member",
    "NodeAdminState",
    "NodePartitions",
    "NotFound",
    "OutOfRange",
    "Overloaded",
    "PartitionState",
    "PayloadTooLarge",
    "Producer",
    "ProducerTransport",
    "ReadResult",
    "Record",
    "RecordMetadata",
    "StickyPartitioner",
    "StoredRecord",
    "SyncProducer",
    "Timeout",
    "TopicDescription",
    "TopicInfo",
    "Unauthorized",
    "Unavailable",
    "decode_read_body",
    "error_from_response",
    "key_hash",
    "partition_for",
    "read_replicas",
]
