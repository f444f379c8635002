"""Models of the vault: a saved payment account, and the body that saves one.

Apart from the payments models a sale validates (``payments``): only an enroll sale and the
``vault`` commands use them, so a start neither declares them (some 3 ms of CPU on the way to
READY=1 on the shared 2-core machine) nor builds them after READY=1 with a sale's models
(``assembly/collector.SALE_MODELS``); the first enroll sale builds what it validates.
"""


import enum

from kiosk_agent.service.models.common import RequestBody, ServiceModel


class VaultAccountType(enum.IntEnum):
    CREDIT = 1
    DEBIT = 2
    CHECKING = 3
    SAVINGS = 4


class VaultPaymentAccount(ServiceModel):
    """A vault payment account: every field present; id integer, the rest strings (some null)."""

    id: int
    vaults_id: str
    uuid: str
    mid: str
    account_token: str
    card_brand_id: str
    vault_account_type_id: str
    name: str
    nickname: str | None
    last_four: str
    expiration: str | None
    account_zip: str
    address1: str
    address2: str | None
    city: str
    region: str
    country: str
    email: str
    phone: str
    custom_06: str | None
    custom_07: str | None
    custom_08: str | None
    custom_09: str | None
    custom_10: str | None
    entry_class: str | None
    is_deleted: str
    is_default: str
    updated: str
    updated_by: str
    created: str
    created_by: str
    profile_id: str | None
    ach_acct_type_id: str | None
    product_id: str

    @property
    def deleted(self) -> bool:
        return self.is_deleted == "1"


class VaultAccountRequest(RequestBody):
    """The body that creates a vault payment account."""

    mid: str | None = None  # None: the client's merchant
    account_token: str
    name: str
    account_zip: str
    address1: str
    city: str
    region: str
    country: str
    email: str
    phone: str
    nickname: str | None = None
    address2: str | None = None
    expiration: str | None = None
    is_default: str | None = None
