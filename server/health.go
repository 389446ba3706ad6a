package server

import (
	"errors"
	"fmt"

	"github.com/hashicorp/raft"
)

// ReadyMaxLag is how many committed entries a node may not have applied
// yet and still count as ready. A follower applies an entry moments after
// it learns of its commit, so a healthy node under load trails by a few;
// one that trails by more is catching up (after a restart, or fed a
// snapshot) and would answer stale reads far behind the cluster.
const ReadyMaxLag = 256

// ErrNotReady is wrapped by every reason Ready gives.
var ErrNotReady = errors.New("not ready")

// Ready reports whether the node can serve its share of the cluster's
// work: it is a member of the Raft configuration, knows a leader, has
// applied to within ReadyMaxLag of its commit index, and is not restoring
// a snapshot. The error says which condition failed. Ready only reads
// local state, so a health probe never waits on the network.
func (n *Node) Ready() error {
	if st := n.raft.State(); st == raft.Shutdown {
		return fmt.Errorf("%w: raft has shut down (removed from the cluster, or stopping)", ErrNotReady)
	}
	if _, member := n.suffrage(n.cfg.ID); !member {
		return fmt.Errorf("%w: not a member of the cluster configuration yet", ErrNotReady)
	}
	if id, _ := n.Leader(); id == "" {
		return fmt.Errorf("%w: no leader known", ErrNotReady)
	}
	if n.sync.restoring.Load() {
		return fmt.Errorf("%w: restoring a snapshot", ErrNotReady)
	}
	commit, applied := n.raft.CommitIndex(), n.AppliedIndex()
	if commit > applied && commit-applied > ReadyMaxLag {
		return fmt.Errorf("%w: applied index %d trails the commit index %d by more than %d",
			ErrNotReady, applied, commit, ReadyMaxLag)
	}
	return nil
}
