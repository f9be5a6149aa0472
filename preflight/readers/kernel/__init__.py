"""What the kernel logged: Xid/SXid events and their catalog, the journal and /dev/kmsg, PCIe bandwidth notices."""
