package server

import (
	"bytes"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/memoryfs/memfs/fsm"
	"github.com/memoryfs/memfs/fsm/block"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/memfspb"
)

func TestCountingStreamNeedsAdvertisableAddress(t *testing.T) {
	_, err := newCountingTCPStream("0.0.0.0:0", nil, &traffic{})
	require.Error(t, err)
	adv := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 7101}
	s, err := newCountingTCPStream("0.0.0.0:0", adv, &traffic{})
	require.NoError(t, err)
	require.Equal(t, adv, s.Addr())
	require.NoError(t, s.Close())
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
