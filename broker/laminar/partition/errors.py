"""What a partition replica refuses or fails with (the API maps each to a status)."""


class NotLeader(Exception):
    def __init__(self, leader: str | None) -> None:
        super().__init__(f"not the leader (leader: {leader})")
        self.leader = leader


class Overloaded(Exception):
    """Too many bytes await their commit on this replica."""


class SequenceConflict(Exception):
    """A producer sequence that is neither the next one nor a recent duplicate."""


class CommitLost(Exception):
    """The entry was certainly not committed: the next leader's entry took its index (nothing
    of it was written; the request may be repeated as it is)."""


class CommitUnknown(Exception):
    """Leadership was lost, or the replica closed, after the entry was proposed and before its
    commit was known: the next leader may still commit it, or not."""


class ReplicaClosed(Exception):
    """The replica is closed (the broker is stopping, or the replica was dropped or moved):
    it refuses requests and ends long polls without doing anything."""
