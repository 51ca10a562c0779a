import pyptx_shim


def test_shim_reports_unavailable():
    assert pyptx_shim.shim_is_available() is False


def test_load_error_explains_why():
    message = pyptx_shim.shim_load_error()
    assert isinstance(message, str)
    assert "not built" in message


def test_public_api():
    assert set(pyptx_shim.__all__) == {"shim_is_available", "shim_load_error"}
