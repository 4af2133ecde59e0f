"""Admin calls to RocketMQ 5.x controllers (`mqadmin getControllerMetaData`,
`getSyncStateSet`, `electMaster`): ask any controller who leads, then ask the leader.

Against controllers with ACL on, pass a `RequestSigner` (reads need any account, a
designated election an admin account); against a TLS port, `TlsClientSettings`.
`ControllerAdmin.from_config` takes both from a `ClientConfig` (`access_key` / `secret_key`,
`use_tls` / `tls_*`, and their TRIMQ_* defaults), as mqadmin's other commands do."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from client.config import ClientConfig
from client.errors import MQClientError
from common.acl import RequestSigner
from remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from remoting.protocol.headers import (
    ElectMasterRequestHeader,
    ElectMasterResponseHeader,
    GetMetaDataResponseHeader,
)
from remoting.tls import TlsClientSettings

__all__ = ["ControllerAdmin", "ControllerMetadata"]


@dataclass(frozen=True, slots=True)
class ControllerMetadata:
    """What a controller says of the controller group (1005)."""

    addr: str
    group: str | None
    leader_id: str | None
    leader_address: str | None
    is_leader: bool
    peers: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "addr": self.addr,
            "group": self.group,
            "controllerLeaderId": self.leader_id,
            "controllerLeaderAddress": self.leader_address,
            "isLeader": self.is_leader,
            "peers": self.peers,
        }


class ControllerAdmin:
    """Calls to the controllers at `addrs` (`;`-separated, as `controllerAddr`).

    Args:
        signer: signs every request (controllers with ACL on); None: unsigned.
        tls: TLS on every connection; None: plain.

    Raises (every call): MQClientError when no controller answers or one refuses (its code
    and remark in the message); RemotingError for transport failures.
    """

    def __init__(
        self,
        addrs: str,
        timeout_ms: int = 5000,
        *,
        signer: RequestSigner | None = None,
        tls: TlsClientSettings | None = None,
    ) -> None:
        self.addrs = [a.strip() for a in addrs.split(";") if a.strip()]
        if not self.addrs:
            raise MQClientError("no controller address given")
        self.timeout_ms = timeout_ms
        self._client = RemotingClient(before_send=signer, tls=tls)

    @classmethod
    def from_config(cls, addrs: str, config: ClientConfig) -> ControllerAdmin:
        """With the credentials and TLS settings of a client configuration.

        Raises:
            TlsConfigError: an inconsistent TLS combination.
        """
        return cls(
            addrs,
            max(5000, config.mq_client_api_timeout_ms),
            signer=config.request_signer(),
            tls=config.tls_settings(),
        )

    async def __aenter__(self) -> ControllerAdmin:
        await self._client.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.__aexit__(None, None, None)

    async def _call(self, addr: str, cmd: RemotingCommand) -> RemotingCommand:
        resp = await self._client.invoke(addr, cmd, self.timeout_ms)
        if resp.code != ResponseCode.SUCCESS:
            raise MQClientError(f"controller {addr} refused (code {resp.code}): {resp.remark}")
        return resp

    async def metadata(self, addr: str | None = None) -> ControllerMetadata:
        """CONTROLLER_GET_METADATA_INFO of `addr` (default: the first controller answering)."""
        errors = []
        for a in [addr] if addr else self.addrs:
            try:
                resp = await self._call(
                    a, RemotingCommand.request(RequestCode.CONTROLLER_GET_METADATA_INFO)
                )
            except Exception as exc:
                errors.append(f"{a}: {exc}")
                continue
            hdr = GetMetaDataResponseHeader.from_fields(resp.ext_fields)
            return ControllerMetadata(
                a,
                hdr.group,
                hdr.controller_leader_id,
                hdr.controller_leader_address,
                hdr.is_leader,
                hdr.peers,
            )
        raise MQClientError("no controller answered: " + "; ".join(errors))

    async def leader(self) -> str:
        meta = await self.metadata()
        if not meta.leader_address:
            raise MQClientError(f"the controllers have no leader now (asked {meta.addr})")
        return meta.leader_address

    async def sync_state_data(self, broker_names: list[str]) -> dict[str, Any]:
        """CONTROLLER_GET_SYNC_STATE_DATA: `replicasInfoTable` by broker name."""
        cmd = RemotingCommand.request(
            RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, body=json.dumps(broker_names).encode()
        )
        resp = await self._call(await self.leader(), cmd)
        table = json.loads(resp.body_bytes() or b"{}").get("replicasInfoTable") or {}
        if not isinstance(table, dict):
            raise MQClientError("the controller's answer has no replicasInfoTable")
        return table

    async def elect_master(self, cluster: str, broker_name: str, broker_id: int) -> dict[str, Any]:
        """CONTROLLER_ELECT_MASTER with `broker_id` designated (an admin's election)."""
        hdr = ElectMasterRequestHeader(
            cluster_name=cluster, broker_name=broker_name, broker_id=broker_id, designate_elect=True
        )
        cmd = RemotingCommand.request(RequestCode.CONTROLLER_ELECT_MASTER, hdr.to_fields())
        resp = await self._call(await self.leader(), cmd)
        out = ElectMasterResponseHeader.from_fields(resp.ext_fields)
        return {
            "masterBrokerId": out.master_broker_id,
            "masterAddress": out.master_address,
            "masterEpoch": out.master_epoch,
            "syncStateSetEpoch": out.sync_state_set_epoch,
        }
