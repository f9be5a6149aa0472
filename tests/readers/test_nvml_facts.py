"""What the NVML child's answers are read into (preflight.readers.nvidia.nvml_facts): the forms of a PCI bus id."""

from preflight.readers.nvidia import nvml_facts


def test_short_pci_matches_sysfs_form():
    assert nvml_facts.short_pci("00000000:1B:00.0") == "0000:1b:00.0"
    assert nvml_facts.short_pci("00000019:01:00.0") == "0019:01:00.0"
