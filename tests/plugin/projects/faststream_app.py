"""An outside project's FastStream test: an app that upper-cases what arrives on one
topic into another, run against the semel broker instead of FastStream's in-memory
TestKafkaBroker, across a broker restart."""
import asyncio

from faststream.kafka import KafkaBroker


def make_app(bootstrap, src, dst):
    broker = KafkaBroker(bootstrap)
    seen = asyncio.Queue()

    @broker.subscriber(src, group_id="upper", auto_offset_reset="earliest")
    @broker.publisher(dst)
    async def upper(msg: str) -> str:
        return msg.upper()

    @broker.subscriber(dst, group_id="check", auto_offset_reset="earliest")
    async def sink(msg: str) -> None:
        await seen.put(msg)
    return broker, seen


def test_faststream_round_trip_and_a_restart(semel_broker, semel_bootstrap, semel_topic):
    src, dst = semel_topic(), semel_topic()

    async def main():
        broker, seen = make_app(semel_bootstrap, src, dst)
        async with broker:
            await broker.start()
            await broker.publish("hello", src)
            first = await asyncio.wait_for(seen.get(), 30)
        semel_broker.kill()
        semel_broker.restart()
        broker, seen = make_app(semel_bootstrap, src, dst)
        async with broker:
            await broker.start()
            await broker.publish("again", src)
            second = await asyncio.wait_for(seen.get(), 30)
        return first, second

    assert asyncio.run(main()) == ("HELLO", "AGAIN")
