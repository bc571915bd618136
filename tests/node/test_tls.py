"""The node's TLS settings (`node/tls.py`) refused with the file that failed named."""

from __future__ import annotations

import pytest
import trustme

from sluicegate.node.config import ConfigError, TlsConfig
from sluicegate.node.tls import from_config


def test_a_missing_key_is_named_in_the_refusal(tmp_path):
    """ssl says only "No such file or directory" when a certificate's key is missing."""
    certificate = tmp_path / "node.pem"
    trustme.CA().issue_cert("n1").cert_chain_pems[0].write_to_path(str(certificate))
    missing = tmp_path / "missing-key.pem"
    with pytest.raises(ConfigError) as refused:
        from_config(TlsConfig(certificate=str(certificate), key=str(missing)))
    assert str(refused.value) == (
        f"[tls] certificate and key: cannot read {missing}: No such file or directory"
    )
