"""The machine's own books (EVA-DTS audit data over DEX/UCS or DDCMP): read, stored in the
journal's database, reconciled with the journal's card sales and shown (docs/audit.md)."""
