"""Per-network constants for the real Sui chain (notes §2.3, §1.5, §5).

Only values that cannot be read from the chain live here: where the node is,
which shared object is the Walrus System, which coin is WAL. The package to
*call* is read live from ``System.package_id`` on every renewal, and the type
origin is re-derived from the System object's own type, so a Walrus upgrade
never needs a Walkeep release. Testnet is redeployed now and then: override
``WALKEEP_SUI_SYSTEM_OBJECT_ID`` / ``WALKEEP_SUI_WAL_COIN_TYPE`` then.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from walkeep.backends.sui.codec import normalize_address, normalize_type
from walkeep.config import Settings

SuiNetwork = Literal["testnet", "mainnet"]

DAY = 86_400


@dataclass(frozen=True, slots=True)
class SuiPreset:
    network: SuiNetwork
    grpc_url: str  # host:port, TLS
    system_object_id: str
    wal_coin_type: str  # e.g. 0x…::wal::WAL (the coin's type argument)
    # The package that *defined* the Walrus types (never changes on upgrade):
    # Blob is ``<origin>::blob::Blob`` and events ``<origin>::events::…``.
    walrus_type_origin: str
    epoch_duration_seconds: int  # Walrus epoch: 14 days mainnet, 1 day testnet
    suiscan_tx: str
    suiscan_object: str
    suivision_tx: str

    @property
    def blob_type(self) -> str:
        return f"{self.walrus_type_origin}::blob::Blob"

    @property
    def wal_coin_object_type(self) -> str:
        return f"0x2::coin::Coin<{self.wal_coin_type}>"

    def with_overrides(self, settings: Settings) -> SuiPreset:
        """Apply ``WALKEEP_SUI_GRPC_URL`` / ``…_SYSTEM_OBJECT_ID`` / ``…_WAL_COIN_TYPE``."""
        return replace(
            self,
            grpc_url=(settings.sui_grpc_url or self.grpc_url).strip(),
            system_object_id=normalize_address(
                settings.sui_system_object_id or self.system_object_id
            ),
            wal_coin_type=normalize_type(settings.sui_wal_coin_type or self.wal_coin_type),
        )


SUI_PRESETS: dict[str, SuiPreset] = {
    "testnet": SuiPreset(
        network="testnet",
        grpc_url="fullnode.testnet.sui.io:443",
        system_object_id=normalize_address(
            "0x6c2547cbbc38025cf3adac45f63cb0a8d12ecf777cdc75a4971612bf97fdf6af"
        ),
        wal_coin_type=normalize_type(
            "0x8270feb7375eee355e64fdb69c50abb6b5f9393a722883c1cf45f8e26048810a::wal::WAL"
        ),
        walrus_type_origin=normalize_address(
            "0xd84704c17fc870b8764832c535aa6b11f21a95cd6f5bb38a9b07d2cf42220c66"
        ),
        epoch_duration_seconds=DAY,
        suiscan_tx="https://suiscan.xyz/testnet/tx/{digest}",
        suiscan_object="https://suiscan.xyz/testnet/object/{object_id}",
        suivision_tx="https://testnet.suivision.xyz/txblock/{digest}",
    ),
    "mainnet": SuiPreset(
        network="mainnet",
        grpc_url="fullnode.mainnet.sui.io:443",
        system_object_id=normalize_address(
            "0x2134d52768ea07e8c43570ef975eb3e4c27a39fa6396bef985b5abc58d03ddd2"
        ),
        wal_coin_type=normalize_type(
            "0x356a26eb9e012a68958082340d4c4116e7f55615cf27affcff209cf0ae544f59::wal::WAL"
        ),
        walrus_type_origin=normalize_address(
            "0xfdc88f7d7cf30afab2f82e8380d11ee8f70efb90e863d1de8616fae1bb09ea77"
        ),
        epoch_duration_seconds=14 * DAY,
        suiscan_tx="https://suiscan.xyz/mainnet/tx/{digest}",
        suiscan_object="https://suiscan.xyz/mainnet/object/{object_id}",
        suivision_tx="https://suivision.xyz/txblock/{digest}",
    ),
}
