package server

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/memoryfs/memfs/fsm"
	pb "github.com/memoryfs/memfs/memfspb"
)

func newTestRaftFSM(t testing.TB) *raftFSM {
	f, err := fsm.New(fsm.Config{})
	require.NoError(t, err)
	return newRaftFSM(f, slog.New(slog.DiscardHandler), newMetrics("t", f.Stats, func() uint64 { return 0 }, &traffic{}))
}

func fsEntry(t testing.TB, cmds ...*pb.Command) []byte {
	b, err := proto.MarshalOptions{}.MarshalAppend([]byte{entryFS},
		&pb.Entry{Version: fsm.EntryVersion, TimeNs: time.Now().UnixNano(), Commands: cmds})
	require.NoError(t, err)
	return b
}

func TestRaftFSMAppliesEveryEntryType(t *testing.T) {
	r := newTestRaftFSM(t)
	mkdir := &pb.Command{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{Loc: &pb.Loc{Path: "/a"}, Mode: 0o755}}}
	logs := []*raft.Log{
		{Index: 1, Type: raft.LogConfiguration},
		{Index: 2, Type: raft.LogCommand, Data: encodeMeta(metaOp{Op: "set", ID: "n1", API: "h:1"})},
		{Index: 3, Type: raft.LogCommand, Data: fsEntry(t, mkdir, mkdir)},
		{Index: 4, Type: raft.LogCommand, Data: []byte{99, 1, 2}},
		{Index: 5, Type: raft.LogCommand, Data: nil},
		{Index: 6, Type: raft.LogCommand, Data: []byte{entryMeta, '{'}},
	}
	out := r.ApplyBatch(logs)
	require.Len(t, out, len(logs))
	res := out[2].(*applyResponse)
	require.NoError(t, res.err)
	require.Len(t, res.results, 2)
	require.Zero(t, res.results[0].Errno)
	require.NotZero(t, res.results[1].Errno, "second mkdir of /a fails")
	for _, i := range []int{3, 4, 5} {
		require.Error(t, out[i].(*applyResponse).err, "entry %d", logs[i].Index)
	}
	require.Equal(t, "h:1", r.member("n1"))
	require.EqualValues(t, 6, r.applied.Load())
	require.NoError(t, r.waitApplied(context.Background(), 6))
}

// sink is an in-memory raft.SnapshotSink.
type sink struct {
	bytes.Buffer
	cancelled bool
}

func (s *sink) ID() string    { return "test" }
func (s *sink) Cancel() error { s.cancelled = true; return nil }
func (s *sink) Close() error  { return nil }

func TestRaftFSMSnapshotRoundTrip(t *testing.T) {
	r := newTestRaftFSM(t)
	r.ApplyBatch([]*raft.Log{
		{Index: 1, Type: raft.LogCommand, Data: encodeMeta(metaOp{Op: "set", ID: "n1", API: "h:1"})},
		{Index: 2, Type: raft.LogCommand, Data: encodeMeta(metaOp{Op: "set", ID: "n2", API: "h:2"})},
		{Index: 3, Type: raft.LogCommand, Data: encodeMeta(metaOp{Op: "del", ID: "n2"})},
		{Index: 4, Type: raft.LogCommand, Data: fsEntry(t, &pb.Command{Op: &pb.Command_Mkdir{
			Mkdir: &pb.MkdirCmd{Loc: &pb.Loc{Path: "/kept"}, Mode: 0o755}}})},
	})
	snap, err := r.Snapshot()
	require.NoError(t, err)
	// Later changes are not in the snapshot.
	r.ApplyBatch([]*raft.Log{{Index: 5, Type: raft.LogCommand, Data: encodeMeta(metaOp{Op: "set", ID: "n3", API: "h:3"})}})
	var s sink
	require.NoError(t, snap.Persist(&s))
	require.False(t, s.cancelled)

	r2 := newTestRaftFSM(t)
	require.NoError(t, r2.Restore(io.NopCloser(bytes.NewReader(s.Bytes()))))
	require.Equal(t, map[string]string{"n1": "h:1"}, r2.memberMap())
	require.EqualValues(t, 4, r2.applied.Load())
	res := r2.fsm.Query(&pb.Query{Q: &pb.Query_Stat{Stat: &pb.StatQuery{Loc: &pb.Loc{Path: "/kept"}}}})
	require.Zero(t, res.Errno, res.Message)

	// A damaged snapshot is refused, not half-restored.
	for _, bad := range [][]byte{nil, []byte("XXXX"), s.Bytes()[:6], append([]byte("MFSN\x09"), s.Bytes()[5:]...)} {
		require.Error(t, newTestRaftFSM(t).Restore(io.NopCloser(bytes.NewReader(bad))))
	}
}

func TestDecodeMetaRejectsMalformed(t *testing.T) {
	for _, in := range []string{``, `{}`, `{"op":"set","id":"a"}`, `{"op":"x","id":"a"}`, `{"op":"del"}`, `[1]`} {
		_, err := decodeMeta([]byte(in))
		require.Error(t, err, in)
	}
	op, err := decodeMeta([]byte(`{"op":"del","id":"a"}`))
	require.NoError(t, err)
	require.Equal(t, metaOp{Op: "del", ID: "a"}, op)
}

func FuzzDecodeMeta(f *testing.F) {
	f.Add(encodeMeta(metaOp{Op: "set", ID: "n1", API: "127.0.0.1:7001"})[1:])
	f.Add(encodeMeta(metaOp{Op: "del", ID: "n2"})[1:])
	f.Add([]byte(`{"op":"set","id":"","api":"x"}`))
	f.Add([]byte(`{"op":`))
	f.Fuzz(func(t *testing.T, data []byte) {
		op, err := decodeMeta(data)
		if err != nil {
			return
		}
		// Whatever decodes must be a complete operation that round-trips.
		require.NotEmpty(t, op.ID)
		again, err := decodeMeta(encodeMeta(op)[1:])
		require.NoError(t, err)
		require.Equal(t, op, again)
	})
}

func FuzzSnapshotHeader(f *testing.F) {
	var b bytes.Buffer
	require.NoError(f, writeSnapshotHeader(&b, snapshotHeader{Applied: 42, Members: map[string]string{"n1": "h:1"}}))
	f.Add(b.Bytes())
	f.Add([]byte("MFSN\x01\x00\x00\x00\x02{}"))
	f.Add([]byte("MFSN\x01\xff\xff\xff\xff"))
	f.Add([]byte("MFSN\x02"))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := readSnapshotHeader(bytes.NewReader(data))
		if err != nil {
			return
		}
		var out bytes.Buffer
		require.NoError(t, writeSnapshotHeader(&out, h))
		again, err := readSnapshotHeader(&out)
		require.NoError(t, err)
		require.Equal(t, h.Applied, again.Applied)
		require.Equal(t, len(h.Members), len(again.Members))
	})
}

// FuzzApplyBatch feeds arbitrary log payloads to the adapter: it must
// answer every entry and never panic.
func FuzzApplyBatch(f *testing.F) {
	f.Add(encodeMeta(metaOp{Op: "set", ID: "n1", API: "h:1"}))
	f.Add(fsEntry(f, &pb.Command{Op: &pb.Command_Mkdir{Mkdir: &pb.MkdirCmd{Loc: &pb.Loc{Path: "/a"}}}}))
	f.Add([]byte{entryFS, 0xff, 0xff})
	f.Add([]byte{7})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := newTestRaftFSM(t)
		out := r.ApplyBatch([]*raft.Log{{Index: 1, Type: raft.LogCommand, Data: data}})
		require.Len(t, out, 1)
		require.NotNil(t, out[0])
		require.EqualValues(t, 1, r.applied.Load())
	})
}
