package server

import (
	"context"
	"syscall"

	"google.golang.org/protobuf/proto"

	pb "github.com/memoryfs/memfs/memfspb"
)

// Dedup on the wire. A write's chunks that the leader's block store already
// holds go into the log entry as hashes instead of bytes, so duplicate data
// costs no log space, no replication traffic and no memory on any node.
// The decision is made on the leader before the entry exists; every replica
// then applies the same entry to the same state, so if a named block was
// freed in between, all of them refuse it alike (EREMOTEIO) and the leader
// sends the original write with its data under the same (session, seq).
// docs/dedup.md has the whole story.

// submitDeduped runs cmd through the batcher, with a write's whole chunks
// hashed once, here, and its stored ones sent by hash when it can.
func (n *Node) submitDeduped(ctx context.Context, cmd *pb.Command) (*pb.Result, uint64, error) {
	slim, saved := n.slimWrite(cmd)
	if slim == nil {
		return n.batcher.submit(ctx, cmd)
	}
	res, idx, err := n.batcher.submit(ctx, slim)
	if saved == 0 || err != nil || res.GetErrno() != uint32(syscall.EREMOTEIO) {
		if err == nil && saved > 0 {
			n.traffic.dedupBytes.Add(saved)
			n.traffic.dedupCommands.Add(1)
		}
		return res, idx, err
	}
	// Refused and not recorded by the state machine: the resend under the
	// same (session, seq) applies as if it were the first attempt.
	n.traffic.dedupResends.Add(1)
	return n.batcher.submit(ctx, cmd)
}

// slimWrite returns cmd cut into pieces at chunk boundaries: every whole,
// aligned chunk goes by hash when the block store holds it, and otherwise
// as data with its hash in sums, so that no replica hashes it again (the
// other pieces stay data, in order). It also returns the bytes sent by
// hash. It returns nil for a write without a whole chunk, and for an
// append, whose offset is known only when it applies. It hashes each
// whole chunk once and nothing else.
func (n *Node) slimWrite(cmd *pb.Command) (*pb.Command, uint64) {
	w := cmd.GetWrite()
	if w == nil || len(w.Hashes) > 0 || w.Append || w.Offset < 0 {
		return nil, 0
	}
	cs := int64(n.fsm.ChunkSize())
	data, off := w.Data, w.Offset
	if int64(len(data)) < cs {
		return nil, 0
	}
	end := off + int64(len(data))
	pieces := (end-1)/cs - off/cs + 1
	hashes, sums := make([][]byte, 0, pieces), make([][]byte, 0, pieces)
	var saved uint64
	for pos := off; pos < end; {
		next := min((pos/cs+1)*cs, end)
		var h, sum []byte
		if pos%cs == 0 && next-pos == cs {
			hv, stored := n.fsm.StoredChunk(data[pos-off : next-off])
			if stored && !n.cfg.DisableWireDedup {
				h, saved = hv, saved+uint64(cs)
			} else {
				sum = hv
			}
		}
		hashes, sums = append(hashes, h), append(sums, sum)
		pos = next
	}
	rest := data
	if saved > 0 {
		rest = make([]byte, 0, uint64(len(data))-saved)
		for i, pos := 0, off; pos < end; i++ {
			next := min((pos/cs+1)*cs, end)
			if hashes[i] == nil {
				rest = append(rest, data[pos-off:next-off]...)
			}
			pos = next
		}
	}
	// Clone everything but the data, so that fields added to the command
	// later travel too.
	w.Data = nil
	slim := proto.Clone(cmd).(*pb.Command)
	w.Data = data
	sw := slim.GetWrite()
	sw.Data, sw.Hashes, sw.Sums, sw.Length = rest, hashes, sums, uint64(len(data))
	return slim, saved
}
