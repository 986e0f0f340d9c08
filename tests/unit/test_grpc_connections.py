"""gateway/grpc/connections.py: what one gRPC connection may hold."""
from __future__ import annotations

import pytest

from ringserve.gateway.grpc.codec import grpc_code
from ringserve.gateway.grpc.connections import ConnectionFull, ConnectionLedger


def test_a_connection_past_its_calls_is_refused_resource_exhausted_and_others_are_not():
    ledger = ConnectionLedger(max_calls=2, max_bytes=1 << 20)
    ledger.admit("a", 10)
    ledger.admit("a", 10)
    with pytest.raises(ConnectionFull, match="holds 2 calls.*--grpc-max-calls-per-connection 2") as info:
        ledger.admit("a", 10)
    assert grpc_code(info.value).name == "RESOURCE_EXHAUSTED"
    ledger.admit("b", 10)  # (another connection)
    ledger.release("a", 10)
    ledger.admit("a", 10)


def test_a_connection_past_its_bytes_is_refused_but_one_holding_nothing_takes_any_request():
    ledger = ConnectionLedger(max_calls=100, max_bytes=100)
    ledger.admit("a", 500)  # (alone: taken, whatever its size)
    with pytest.raises(ConnectionFull, match="--grpc-max-connection-bytes 100"):
        ledger.admit("a", 1)
    ledger.release("a", 500)
    assert ledger.held == {}
    ledger.admit("a", 0)  # a stream, then its requests' bytes as they are read
    ledger.charge("a", 60)
    with pytest.raises(ConnectionFull):
        ledger.charge("a", 60)
    ledger.release("a", 60, calls=0)
    ledger.release("a", 0)
    assert ledger.held == {}
