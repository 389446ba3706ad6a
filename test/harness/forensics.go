package harness

import (
	"fmt"
	"io"
	"sort"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	pb "github.com/memoryfs/memfs/proto"
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
