"""check_export_target refuses an ``out`` that no file system path can be (a NUL byte, a lone
surrogate) with CaptureError (400 invalid_request at the route), not a ValueError (500 internal)."""
from __future__ import annotations

import pytest

from sequence_ai_server.worker.capture import CaptureError
from sequence_ai_server.gateway.capture_export import check_export_target


@pytest.mark.parametrize("out", ["/tmp/seq-export\x00x", "/tmp/seq-export-\ud800"])
def test_an_unusable_out_is_an_invalid_request(tmp_path, out):
    with pytest.raises(CaptureError, match="not a usable path"):
        check_export_target(out, tmp_path / "data", "new")
