"""checkkit/burnin_xid.py's new_xids: which Xids the kernel logged while the burn-in ran, told
from those before it across the forms one event is read in (a /dev/kmsg record, the journal's
dmesg line once the ring has moved past it, dmesg's own)."""

from preflight.checkkit import burnin_xid
from preflight.readers.kernel import xid

# An earlier job's own Xid (RESTART_APP: no finding of the cuda check's), among the oldest
# records of a ring that had wrapped since boot.
OLD = "NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=python, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address"
NEW = "NVRM: Xid (PCI:0000:18:00): 79, pid=5151, name=python3, GPU has fallen off the bus."
KMSG_BEFORE = f"4,100,5123456,-;{OLD}\n6,101,6000000,-;mlx5_core 0000:3b:00.0: link up\n6,102,7000000,-;EXT4-fs (nvme0n1p1): re-mounted\n"


def test_an_old_xid_the_ring_handed_to_the_journal_during_the_burn_is_not_new():
    """The ring moved past record 100 while the burn ran: log_sources._wrapped now gives that
    event as the journal's dmesg line, before the ring's records. Compared as printed, the old
    Xid 13 read as new, and on a loaded GPU the known-good burn FAILed (drain) a healthy node."""
    after = f"[    5.123456] {OLD}\n" + KMSG_BEFORE.split("\n", 1)[1] + "6,150,400000000,-;audit: ok\n"
    before_events, after_events = xid.parse(KMSG_BEFORE), xid.parse(after)
    assert [e.raw for e in before_events] != [e.raw for e in after_events]  # one event, two lines
    assert burnin_xid.new_xids(before_events, after_events, same_source=True) == []
    # An Xid logged while the burn ran is still new, in either form.
    during = after + f"4,151,400500000,-;{NEW}\n"
    found = burnin_xid.new_xids(before_events, xid.parse(during), same_source=True)
    assert [(e["code"], e["pci"]) for e in found] == [(79, "0000:18:00")]
    assert burnin_xid.judge(found, False, {"0000:18:00"}, "diag", "rerun")[0].summary == "new Xid during burn-in: Xid 79 on 0000:18:00"


def test_a_ring_that_first_wrapped_during_the_burn_still_has_its_xids_judged():
    """Read from /dev/kmsg before and from the journal plus /dev/kmsg after (the ring wrapped in
    between): the events carry their time since boot, so the new one is told, not left unjudged."""
    during = f"[    5.123456] {OLD}\n6,150,400000000,-;audit: ok\n4,151,400500000,-;{NEW}\n"
    found = burnin_xid.new_xids(xid.parse(KMSG_BEFORE), xid.parse(during), same_source=False)
    assert [e["code"] for e in found] == [79]


def test_lines_without_a_time_stamp_are_matched_whole_and_not_across_two_sources():
    # printk.time=0 and dmesg: the line is the event.
    plain_before, plain_after = f"{OLD}\n", f"{OLD}\n{NEW}\n"
    assert [e["code"] for e in burnin_xid.new_xids(xid.parse(plain_before), xid.parse(plain_after), same_source=True)] == [79]
    assert burnin_xid.new_xids(xid.parse(plain_before), xid.parse(KMSG_BEFORE + f"4,151,400500000,-;{NEW}\n"), same_source=False) is None
