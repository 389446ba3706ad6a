package fsm_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/fsm"
	ft "github.com/memoryfs/memfs/fsm/fsmtest"
	pb "github.com/memoryfs/memfs/memfspb"
)

// Safe reclamation (the CBUF rule): a block stays valid while anything
// still holds it, even after the store has dropped it. The state machine
// never frees memory itself: the store forgets a block at reference count
// zero, and whoever still holds the *block.Block (a published state that a
// snapshot or a read captured) keeps it alive for Go's collector; block
// bytes are read only through the block (View, ReadAt, Bytes), which holds
// it until the copy is done. Blocks are never modified, so what a
// holder sees cannot change either. These tests check that from the
// outside.

const (
	reclaimFiles  = 8
	reclaimGroups = 4 // files i and i+4 share content: blocks shared across files
)

// version is the content of a file of group g at version v: a header
// naming (g, v), then pseudo-random bytes; 1 to 4 chunks plus a tail.
func version(g, v uint64) []byte {
	n := int(1+(g+v)%4)*cs + int(v%3)*100
	b := make([]byte, n)
	randFill(b, g<<32|v)
	binary.LittleEndian.PutUint64(b, g)
	binary.LittleEndian.PutUint64(b[8:], v)
	return b
}

// checkContent fails unless data (read at offset 0) is a prefix of some
// version of group g, or, when whole, exactly one version.
func checkContent(data []byte, g uint64, whole bool) error {
	if len(data) < 16 {
		return fmt.Errorf("read %d bytes, shorter than the header", len(data))
	}
	gg, v := binary.LittleEndian.Uint64(data), binary.LittleEndian.Uint64(data[8:])
	if gg != g {
		return fmt.Errorf("header names group %d, want %d (bytes of another file)", gg, g)
	}
	want := version(g, v)
	if whole && len(data) != len(want) || len(data) > len(want) || !bytes.Equal(data, want[:len(data)]) {
		return fmt.Errorf("content is not version %d of group %d (%d bytes)", v, g, len(data))
	}
	return nil
}

// TestReclaimUnderConcurrentReadsAndSnapshots overwrites, clones and
// deletes a tree on the apply goroutine while readers and snapshotters
// run: every read returns exactly one valid version (never zeros or
// another file's bytes), every snapshot restores to a tree that passes
// the state machine's invariant checks and holds only valid versions, and
// read results kept across many frees stay intact.
func TestReclaimUnderConcurrentReadsAndSnapshots(t *testing.T) {
	h := ft.New(t, fsm.Config{ChunkSize: cs})
	h.Must(ft.Mkdir("/d", 0o755))
	steps := 3000
	if testing.Short() {
		steps = 600
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	report := func(err error) {
		select {
		case errs <- err:
		default:
		}
		stop.Store(true)
	}
	held := make([][]*pb.Result, 2) // read results each reader keeps
	for r := range 2 {
		wg.Go(func() { held[r] = reclaimReader(h.F, uint64(r), &stop, report) })
	}
	var snaps atomic.Int64
	wg.Go(func() {
		for !stop.Load() {
			if err := checkSnapshot(h.F.Snapshot()); err != nil {
				report(err)
				return
			}
			snaps.Add(1)
		}
	})
	rng := rand.New(rand.NewPCG(4, 4))
	for step := 0; step < steps && !stop.Load(); step++ {
		i := uint64(rng.IntN(reclaimFiles))
		p := fmt.Sprintf("/d/f%d", i)
		switch rng.IntN(6) {
		case 0:
			h.Do(ft.Remove(p))
		case 1:
			j := (i + reclaimGroups) % reclaimFiles // same group: same valid contents
			h.Do(ft.Remove(fmt.Sprintf("/d/f%d", j)))
			h.Do(ft.Clone(p, fmt.Sprintf("/d/f%d", j), false))
		default:
			data := version(i%reclaimGroups, uint64(step))
			h.Must(&pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{
				Loc: ft.Path(p), Data: data, Create: true, Truncate: true, Mode: 0o644}}})
		}
	}
	// Let a snapshot or two run against the final, churned state.
	for n := snaps.Load(); snaps.Load() < n+2 && !stop.Load(); {
		runtime.Gosched()
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Positive(t, snaps.Load())
	runtime.GC()
	for r, rs := range held {
		for _, res := range rs {
			require.NoError(t, checkContent(res.Data, res.Attr.Ino, false), "held read of reader %d", r)
		}
	}
}

// reclaimReader reads random files until stop, checks each answer, and
// returns some results it kept (their Attr.Ino is overwritten with the
// file's group for the final check). Results are copies of block bytes,
// so kept ones must stay intact whatever the store frees later.
func reclaimReader(f *fsm.FSM, seed uint64, stop *atomic.Bool, report func(error)) []*pb.Result {
	rng := rand.New(rand.NewPCG(seed, 9))
	var kept []*pb.Result
	for n := 0; !stop.Load(); n++ {
		i := uint64(rng.IntN(reclaimFiles))
		length := int64(1 << 20)
		if n%2 == 0 {
			length = cs
		}
		res := f.Query(ft.Read(fmt.Sprintf("/d/f%d", i), 0, length))
		if syscall.Errno(res.Errno) == syscall.ENOENT {
			continue
		}
		if res.Errno != 0 {
			report(fmt.Errorf("read f%d: %s", i, res.Message))
			return kept
		}
		if err := checkContent(res.Data, i%reclaimGroups, length > cs); err != nil {
			report(fmt.Errorf("read f%d: %w", i, err))
			return kept
		}
		if n%50 == 0 && len(kept) < 200 {
			res.Attr.Ino = i % reclaimGroups
			kept = append(kept, res)
		}
	}
	return kept
}

// checkSnapshot writes sn out, restores it into a new state machine
// (which re-hashes every block and checks the tree's invariants) and
// checks every file there holds exactly one valid version.
func checkSnapshot(sn fsm.Snapshot) error {
	var buf bytes.Buffer
	if _, err := sn.WriteTo(&buf); err != nil {
		return fmt.Errorf("snapshot %d: write: %w", sn.Index(), err)
	}
	g, err := fsm.New(fsm.Config{ChunkSize: cs})
	if err != nil {
		return err
	}
	if err := g.Restore(&buf); err != nil {
		return fmt.Errorf("snapshot %d: restore: %w", sn.Index(), err)
	}
	for i := range uint64(reclaimFiles) {
		res := g.Query(ft.Read(fmt.Sprintf("/d/f%d", i), 0, 1<<20))
		if syscall.Errno(res.Errno) == syscall.ENOENT {
			continue
		}
		if res.Errno != 0 {
			return fmt.Errorf("snapshot %d: read f%d: %s", sn.Index(), i, res.Message)
		}
		if err := checkContent(res.Data, i%reclaimGroups, true); err != nil {
			return fmt.Errorf("snapshot %d: f%d: %w", sn.Index(), i, err)
		}
	}
	return nil
}

// TestFreedBlockOutlivesTheStore is the rule step by step: a read result
// and a snapshot taken before a file is deleted still see its bytes after
// the store has dropped every block of it and the collector has run with
// fresh allocations competing for the memory.
func TestFreedBlockOutlivesTheStore(t *testing.T) {
	h := ft.New(t, fsm.Config{ChunkSize: cs})
	data := version(1, 7)
	h.Must(&pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{
		Loc: ft.Path("/f"), Data: data, Create: true, Mode: 0o644}}})
	first := h.MustQ(ft.Read("/f", 0, cs)) // a slice of the block itself
	sn := h.F.Snapshot()
	h.Must(ft.Remove("/f"))
	// Churn: other content comes and goes through the same sizes.
	for v := range uint64(20) {
		h.Must(&pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{
			Loc: ft.Path("/g"), Data: version(2, v), Create: true, Truncate: true, Mode: 0o644}}})
	}
	h.Must(ft.Remove("/g"))
	_, stored := h.F.StoredChunk(data[:cs])
	require.False(t, stored, "the store must have dropped the block")
	require.Zero(t, h.F.Stats().Block.PhysicalBytes)
	var junk [][]byte
	for range 64 {
		runtime.GC()
		junk = append(junk, bytes.Repeat([]byte{0xff}, cs))
	}
	require.Equal(t, data[:cs], first.Data, "a read in flight keeps its block")
	var buf bytes.Buffer
	_, err := sn.WriteTo(&buf)
	require.NoError(t, err)
	g, err := fsm.New(fsm.Config{ChunkSize: cs})
	require.NoError(t, err)
	require.NoError(t, g.Restore(&buf))
	require.Equal(t, data, g.Query(ft.Read("/f", 0, 1<<20)).Data, "a snapshot keeps its blocks")
	require.Len(t, junk, 64)
}
