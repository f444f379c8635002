"""A private CA file for the broker's TLS, checked as TLS will load it, with what is wrong named.

``check-config`` refuses a CA file that loads no certificate (a key, a DER file, a copy cut
short), and ``doctor`` and the unit name it too: before, it passed the config check and the
doctor said only "the connection failed".
"""

from __future__ import annotations

import ssl

PEM_HINT = "expected PEM certificates (-----BEGIN CERTIFICATE-----)"


def ca_file_problem(path: str) -> str | None:
    """What keeps ``path`` from being a CA file TLS loads; None when it loads."""
    try:
        ssl.create_default_context(cafile=path)
    except FileNotFoundError:
        return "no such file"
    except PermissionError:
        return "not readable by this user"
    except IsADirectoryError:
        return "a directory, not a file"
    except ssl.SSLError as err:
        return f"holds no certificate TLS can load ({err.reason or err}): {PEM_HINT}"
    except (OSError, ValueError) as err:
        return f"cannot be read: {getattr(err, 'strerror', None) or err}"
    return None
