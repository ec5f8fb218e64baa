"""The mk._runtime extension builds, imports and reports how it was built."""

import mk
import mk._runtime as rt


def test_runtime_version_matches_package() -> None:
    assert rt.__version__ == mk.__version__
    info = rt.build_info()
    assert info["version"] == mk.__version__
    assert info["abi"] == rt.abi >= 1
    assert info["cplusplus"] >= 201703


def test_hardware_threads_positive() -> None:
    assert rt.hardware_threads() >= 1
