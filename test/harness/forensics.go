package harness

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/test/model"
)

// entryFS is the server's type byte of a file system log entry (the
// server's raftfsm.go): a pb.Entry follows it.
const entryFS = 1

// DuplicateCommands scans the Raft logs kept by Memory storage for mutating
// commands whose (session, seq) appears at more than one log index of the
// same node, which is how a retried request is appended again; the state
// machine must then apply it once. It writes one line per such command
// (its indexes and terms on each node) to w and returns how many it found.
// Only Memory storage keeps logs the harness can read.
func (c *Cluster) DuplicateCommands(w io.Writer) int {
	type key struct{ session, seq uint64 }
	found := 0
	for _, s := range c.nodes {
		if s.stores == nil {
			continue
		}
		seen := map[key][]string{}
		first, _ := s.stores.Log.FirstIndex()
		last, _ := s.stores.Log.LastIndex()
		for i := first; i <= last && i > 0; i++ {
			var l raft.Log
			if s.stores.Log.GetLog(i, &l) != nil || l.Type != raft.LogCommand || len(l.Data) == 0 || l.Data[0] != entryFS {
				continue
			}
			var e pb.Entry
			if proto.Unmarshal(l.Data[1:], &e) != nil {
				continue
			}
			for _, cmd := range e.GetCommands() {
				if cmd.GetSeq() == 0 {
					continue
				}
				k := key{cmd.GetSession(), cmd.GetSeq()}
				seen[k] = append(seen[k], fmt.Sprintf("%d(t%d)", l.Index, l.Term))
			}
		}
		var lines []string
		for k, at := range seen {
			if len(at) > 1 {
				lines = append(lines, fmt.Sprintf("%s: session %d seq %d at %v", s.id, k.session, k.seq, at))
			}
		}
		sort.Strings(lines)
		for _, l := range lines {
			fmt.Fprintln(w, l)
		}
		found += len(lines)
	}
	return found
}

// convergenceForensics logs every running node's Raft state and saves the
// stacks of every goroutine in the process: a replica that stops catching
// up on a healed network is a liveness bug (a replication goroutine stuck
// in an RPC, a follower's state machine blocked), and the Raft logs are
// off in long runs.
func (c *Cluster) convergenceForensics(t testing.TB) {
	for i := range c.nodes {
		n := c.Node(i)
		if n == nil {
			t.Logf("%s: down", c.nodes[i].id)
			continue
		}
		st := n.Raft().Stats()
		t.Logf("%s: state=%s term=%s last_log=%s commit=%s applied=%s fsm_pending=%s last_snapshot=%s last_contact=%s",
			n.ID(), st["state"], st["term"], st["last_log_index"], st["commit_index"], st["applied_index"],
			st["fsm_pending"], st["last_snapshot_index"], st["last_contact"])
	}
	dir, err := model.OutDir(t.Name(), c.opts.Seed)
	if err != nil {
		return
	}
	p := filepath.Join(dir, "goroutines.txt")
	f, err := os.Create(p)
	if err != nil {
		return
	}
	defer f.Close()
	if pprof.Lookup("goroutine").WriteTo(f, 2) == nil {
		t.Logf("every goroutine's stack saved in %s", p)
	}
}
