package server

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/memoryfs/memfs/fsm"
	"github.com/memoryfs/memfs/fsm/block"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/memfspb"
)

func randomBytes(n int, seed ...byte) []byte {
	var key [32]byte
	key[copy(key[:], seed)] = 6
	b := make([]byte, n)
	_, _ = rand.NewChaCha8(key).Read(b)
	return b
}

// trafficOf returns every running node's counters by id.
func trafficOf(c *Cluster) map[string]Traffic {
	out := map[string]Traffic{}
	for _, n := range c.Nodes() {
		out[n.ID()] = n.Traffic()
	}
	return out
}

// settle waits until every node has applied what the leader has.
func settle(t *testing.T, c *Cluster) {
	t.Helper()
	c.WaitApplied(c.WaitLeader(10*time.Second).AppliedIndex(), 30*time.Second)
}

// TestWireDedup writes the same 2 MiB twice (streamed) and a half-new
// 1 MiB once, with dedup on the wire and without, and checks what reached
// every node's log and the network, and that every node stores each
// unique byte once either way.
func TestWireDedup(t *testing.T) {
	const size = 2 << 20
	for _, tc := range []struct {
		name    string
		disable bool
	}{{"on", false}, {"off", true}} {
		t.Run(tc.name, func(t *testing.T) {
			c := StartCluster(t, 3, WithEphemeral(), WithNodeConfig(func(_ int, cfg *Config) {
				cfg.DisableWireDedup = tc.disable
			}))
			s := openSession(t, c.Client(c.WaitLeader(10*time.Second).APIAddr()))
			data := randomBytes(size, 1)
			s.create("/a")
			s.streamWrite("/a", data, 1<<20)
			s.create("/b")
			s.create("/c")
			settle(t, c)
			before := trafficOf(c)

			s.streamWrite("/b", data, 1<<20)
			half := append(append([]byte(nil), data[:512<<10]...), randomBytes(512<<10, 2)...)
			s.write("/c", 0, half)
			settle(t, c)
			after := trafficOf(c)

			var sent, deduped uint64
			for id, a := range after {
				b := before[id]
				logged := a.LogBytes - b.LogBytes
				if tc.disable {
					require.GreaterOrEqual(t, logged, uint64(size+1<<20), "node %s log", id)
				} else {
					// The half-new write's new half, plus hashes and framing.
					require.GreaterOrEqual(t, logged, uint64(512<<10), "node %s log", id)
					require.Less(t, logged, uint64(512<<10+64<<10), "node %s log", id)
				}
				sent += a.NetSent - b.NetSent
				deduped += a.DedupBytes - b.DedupBytes
			}
			if tc.disable {
				require.GreaterOrEqual(t, sent, uint64(2*(size+1<<20)), "to two followers")
				require.Zero(t, deduped)
			} else {
				require.Less(t, sent, uint64(2*(512<<10)+256<<10))
				require.Equal(t, uint64(size+512<<10), deduped)
			}
			st, err := c.Client(c.Nodes()[1].APIAddr()).Status(ctxTimeout(t, 10*time.Second), &pb.StatusRequest{Version: pb.Version})
			require.NoError(t, err)
			require.Len(t, st.Nodes, 3)
			for _, ns := range st.Nodes {
				require.Empty(t, ns.Error)
				require.Equal(t, uint64(size+512<<10), ns.PhysicalBytes, "status of %s", ns.Id)
				require.Equal(t, uint64(2*size+1<<20), ns.LogicalBytes, "status of %s", ns.Id)
				require.Equal(t, uint64(size), ns.SharedBytes, "status of %s", ns.Id) // /a and /b share everything
				require.Positive(t, ns.LogBytes)
				require.Positive(t, ns.NetSentBytes)
				require.Positive(t, ns.NetReceivedBytes)
			}
			require.Equal(t, uint64(size), st.SharedBytes)
			require.Equal(t, uint64(2*size+1<<20), st.RefBytes)
			for _, n := range c.Nodes() {
				st := n.FSM().Stats()
				require.Equal(t, uint64(size+512<<10), st.Block.PhysicalBytes, "node %s", n.ID())
				require.Equal(t, data, readAll(t, c.Client(n.APIAddr()), "/b", pb.Consistency_STALE))
				require.Equal(t, half, readAll(t, c.Client(n.APIAddr()), "/c", pb.Consistency_STALE))
			}
		})
	}
}

// TestWireDedupResendsWhenBlockFreed races by-hash writes against the
// removal of the only other file holding their block. Whenever the block
// goes between the leader's check and the apply, every replica refuses the
// entry (EREMOTEIO) and the leader resends the data: the client sees
// every write succeed with the right content, and nothing else.
func TestWireDedupResendsWhenBlockFreed(t *testing.T) {
	c := StartCluster(t, 3, WithEphemeral())
	leader := c.WaitLeader(10 * time.Second)
	cli := c.Client(leader.APIAddr())
	chunk := randomBytes(64<<10, 3) // one default-size chunk
	put := func(path string) *pb.Command {
		return &pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{
			Loc: &pb.Loc{Path: path}, Data: chunk, Create: true, Truncate: true, Mode: 0o644}}}
	}
	rm := func(path string) *pb.Command {
		return &pb.Command{Op: &pb.Command_Remove{Remove: &pb.RemoveCmd{Loc: &pb.Loc{Path: path}}}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for w := range 4 {
		s := openSession(t, cli)
		wg.Go(func() {
			path := fmt.Sprintf("/w%d", w)
			read := &pb.QueryRequest{Version: pb.Version, Query: &pb.Query{Q: &pb.Query_Read{Read: &pb.ReadQuery{
				Loc: &pb.Loc{Path: path}, Length: 1 << 20}}}}
			// Until both paths were taken: the first by-hash write may
			// itself be the one refused and resent.
			for tr := leader.Traffic(); ctx.Err() == nil && (tr.DedupResends == 0 || tr.DedupCommands == 0); tr = leader.Traffic() {
				res, err := s.tryApply(put(path))
				if !assertOK(t, res, err, "write %s", path) {
					return
				}
				var got *pb.QueryResponse
				err = retryUnavailable(func(ctx context.Context) error {
					got, err = cli.Query(ctx, read)
					return err
				})
				if !assertOK(t, got.GetResult(), err, "read %s", path) || !assertSame(t, chunk, got.Result.Data, path) {
					return
				}
				if res, err = s.tryApply(rm(path)); !assertOK(t, res, err, "remove %s", path) {
					return
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, ctx.Err(), "no write raced with a removal, or none went by hash, within the time")
	tr := leader.Traffic()
	require.Positive(t, tr.DedupResends)
	require.Positive(t, tr.DedupCommands, "some writes went by hash")
	t.Logf("by hash: %d writes, resent with data: %d", tr.DedupCommands, tr.DedupResends)
}

func assertOK(t *testing.T, r *pb.Result, err error, format string, args ...any) bool {
	t.Helper()
	what := fmt.Sprintf(format, args...)
	return assert(t, err == nil, "%s: %v", what, err) &&
		assert(t, r.GetErrno() == 0, "%s: errno %d: %s", what, r.GetErrno(), r.GetMessage())
}

func assertSame(t *testing.T, want, got []byte, what string) bool {
	t.Helper()
	return assert(t, string(want) == string(got), "%s: content differs (%d bytes read)", what, len(got))
}

// assert reports a failure from a goroutine other than the test's.
func assert(t *testing.T, ok bool, format string, args ...any) bool {
	t.Helper()
	if !ok {
		t.Errorf(format, args...)
	}
	return ok
}

func TestCountingStreamNeedsAdvertisableAddress(t *testing.T) {
	_, err := newCountingTCPStream("0.0.0.0:0", nil, &traffic{})
	require.Error(t, err)
	adv := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 7101}
	s, err := newCountingTCPStream("0.0.0.0:0", adv, &traffic{})
	require.NoError(t, err)
	require.Equal(t, adv, s.Addr())
	require.NoError(t, s.Close())
}

// TestLeaderBudgetAppliesEverywhere gives the three nodes different memory
// limits. The leader stamps its own on every entry, so all replicas refuse
// the same writes and end with the same data and the same budget.
func TestLeaderBudgetAppliesEverywhere(t *testing.T) {
	limits := []uint64{1 << 20, 2 << 20, 3 << 20}
	c := StartCluster(t, 3, WithEphemeral(), WithNodeConfig(func(i int, cfg *Config) {
		cfg.MemoryLimit = limits[i]
	}))
	s := openSession(t, c.Client(c.WaitLeader(10*time.Second).APIAddr()))
	refused := 0
	for i := range 8 {
		path := fmt.Sprintf("/f%d", i)
		s.create(path)
		if errnoOf(s.apply(writeCmd(path, 0, randomBytes(512<<10, byte(10+i))))) == syscall.ENOSPC {
			refused++
		}
	}
	require.Positive(t, refused, "8 × 512 KiB exceed every limit")
	settle(t, c)
	leader := c.WaitLeader(10 * time.Second)
	want := leader.FSM().Stats()
	require.Contains(t, limits, want.Block.Limit)
	require.LessOrEqual(t, want.Block.PhysicalBytes, want.Block.Limit)
	for _, n := range c.Nodes() {
		got := n.FSM().Stats()
		require.Equal(t, want.Block, got.Block, "node %s", n.ID())
		require.Equal(t, want.LogicalBytes, got.LogicalBytes, "node %s", n.ID())
	}
}

// BenchmarkSlimWrite is the leader's whole dedup-on-the-wire cost for one
// 1 MiB write: of unique data (16 hashes, nothing found, the data goes
// with its sums) and of stored data (16 hashes and a by-hash command):
//
//	go test ./server/ -run '^$' -bench SlimWrite
func BenchmarkSlimWrite(b *testing.B) {
	for _, stored := range []bool{false, true} {
		name := map[bool]string{false: "unique", true: "stored"}[stored]
		b.Run(name, func(b *testing.B) {
			f, err := fsm.New(fsm.Config{})
			require.NoError(b, err)
			data := randomBytes(1<<20, 5)
			if stored {
				r := f.Apply(1, ft.Entry(1, &pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{
					Loc: ft.Path("/f"), Data: data, Create: true, Mode: 0o644}}}))
				require.Zero(b, r[0].Errno, r[0].Message)
			}
			n := &Node{fsm: f}
			cmd := writeCmd("/g", 0, data)
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if slim, saved := n.slimWrite(cmd); slim == nil || (saved > 0) != stored {
					b.Fatalf("slim %v, saved %d, stored %v", slim != nil, saved, stored)
				}
			}
		})
	}
}

// TestSlimWrite checks which pieces the leader sends by hash, which as
// data with their sum, that each sum is its piece's hash, and that the
// slim command keeps everything else of the original, which stays intact
// for a resend.
func TestSlimWrite(t *testing.T) {
	const cs = 64 << 10
	f, err := fsm.New(fsm.Config{})
	require.NoError(t, err)
	stored := randomBytes(4*cs, 7)
	r := f.Apply(1, ft.Entry(1, &pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{
		Loc: ft.Path("/f"), Data: stored, Create: true, Mode: 0o644}}}))
	require.Zero(t, r[0].Errno, r[0].Message)
	fresh := randomBytes(2*cs, 8)
	mixed := append(append(append([]byte(nil), stored[:2*cs]...), fresh[:cs]...), stored[3*cs:]...)
	edges := append(append(bytes.Repeat([]byte{1}, 10), stored[:cs]...), 2)
	tests := []struct {
		name    string
		w       *pb.WriteCmd
		disable bool
		pieces  string // per piece: h by hash, s data with its sum, - data alone; "": no slim command
	}{
		{"all stored", &pb.WriteCmd{Loc: ft.Path("/g"), Data: stored}, false, "hhhh"},
		{"mixed", &pb.WriteCmd{Handle: 9, Offset: 8 * cs, Data: mixed}, false, "hhsh"},
		{"unaligned edges", &pb.WriteCmd{Loc: ft.Path("/g"), Offset: cs - 10, Data: edges}, false, "-h-"},
		{"create and truncate kept", &pb.WriteCmd{Loc: ft.Path("/g"), Data: stored[:2*cs], Create: true, Truncate: true, Mode: 0o600, Uid: 5, Gid: 6, Excl: true},
			false, "hh"},
		{"nothing stored", &pb.WriteCmd{Loc: ft.Path("/g"), Data: fresh}, false, "ss"},
		{"a partial last piece", &pb.WriteCmd{Loc: ft.Path("/g"), Data: fresh[:cs+5]}, false, "s-"},
		{"shorter than a chunk", &pb.WriteCmd{Loc: ft.Path("/g"), Data: stored[:cs-1]}, false, ""},
		{"append", &pb.WriteCmd{Loc: ft.Path("/g"), Data: stored, Append: true}, false, ""},
		{"already by hash", &pb.WriteCmd{Loc: ft.Path("/g"), Hashes: [][]byte{make([]byte, 32)}, Length: cs}, false, ""},
		{"wire dedup disabled", &pb.WriteCmd{Loc: ft.Path("/g"), Data: stored}, true, "ssss"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := &Node{fsm: f, cfg: Config{DisableWireDedup: tc.disable}}
			cmd := &pb.Command{Session: 3, Seq: 4, Ack: 2, Op: &pb.Command_Write{Write: tc.w}}
			orig := proto.Clone(cmd)
			slim, saved := n.slimWrite(cmd)
			require.True(t, proto.Equal(orig, cmd), "the original must stay intact for a resend")
			if tc.pieces == "" {
				require.Nil(t, slim)
				return
			}
			sw := slim.GetWrite()
			require.Len(t, sw.Hashes, len(tc.pieces))
			require.Len(t, sw.Sums, len(tc.pieces))
			var want uint64
			for i, kind := range tc.pieces {
				lo := max(int64(i)*cs-tc.w.Offset%cs, 0)
				hi := min(int64(i+1)*cs-tc.w.Offset%cs, int64(len(tc.w.Data)))
				sum := block.Sum(tc.w.Data[lo:hi])
				switch kind {
				case 'h':
					require.Equal(t, sum[:], sw.Hashes[i], "piece %d", i)
					require.Empty(t, sw.Sums[i], "piece %d", i)
					want += cs
				case 's':
					require.Empty(t, sw.Hashes[i], "piece %d", i)
					require.Equal(t, sum[:], sw.Sums[i], "piece %d", i)
				default:
					require.Empty(t, sw.Hashes[i], "piece %d", i)
					require.Empty(t, sw.Sums[i], "piece %d", i)
				}
			}
			require.Equal(t, want, saved)
			require.Equal(t, uint64(len(tc.w.Data)), sw.Length)
			require.Equal(t, uint64(len(tc.w.Data))-saved, uint64(len(sw.Data)))
			// Everything but data, hashes, sums and length is the original's.
			sw.Data, sw.Hashes, sw.Sums, sw.Length = tc.w.Data, nil, nil, 0
			require.True(t, proto.Equal(orig, slim), "slim command differs beyond data, hashes and sums")
		})
	}
}
