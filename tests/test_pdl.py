"""Programmatic dependent launch (dflash24/kernels/pdl.py): which launches get it. Its kernels' griddepcontrol code
is compiled for sm_90 by test_kernel_compile.py (the PDL cases); its speed and correctness on a GPU are measured by
benchmarks/gpu_pending.sh part29."""
import torch

from dflash24.kernels import pdl


def test_pdl_only_when_switched_on_and_on_sm90(monkeypatch):
    cuda = torch.device("cuda", 0)
    assert pdl.launch_options(torch.device("cpu")) == {}
    monkeypatch.setattr(pdl, "ENABLED", False)
    assert pdl.launch_options(cuda) == {}                       # switched off (DFLASH24_PDL=0): no CUDA query at all
    monkeypatch.setattr(pdl, "ENABLED", True)
    monkeypatch.setattr(pdl, "_CAPABLE", {})
    caps = {0: (8, 6), 1: (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: caps[i])
    assert pdl.launch_options(torch.device("cpu")) == {}
    assert pdl.launch_options(cuda) == {}                       # an RTX 3090: griddepcontrol needs sm_90
    assert pdl.launch_options(torch.device("cuda", 1)) == {"PDL": True, "launch_pdl": True}


def test_on_unless_switched_off():
    assert pdl.switched_on({})
    assert pdl.switched_on({"DFLASH24_PDL": "1"})
    assert not pdl.switched_on({"DFLASH24_PDL": "0"})


def test_early_trigger_passes_pdl_2(monkeypatch):
    """EARLY (DFLASH24_PDL_EARLY=1): the kernels get PDL = 2 (launch_dependents before the wait, pdl_enter)."""
    monkeypatch.setattr(pdl, "ENABLED", True)
    monkeypatch.setattr(pdl, "_CAPABLE", {0: True})
    monkeypatch.setattr(pdl, "EARLY", True)
    assert pdl.launch_options(torch.device("cuda", 0)) == {"PDL": 2, "launch_pdl": True}
    monkeypatch.setattr(pdl, "EARLY", False)
    assert pdl.launch_options(torch.device("cuda", 0)) == {"PDL": True, "launch_pdl": True}
