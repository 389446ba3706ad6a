package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/memoryfs/memfs/fsm"
	"github.com/memoryfs/memfs/fsm/block"
	pb "github.com/memoryfs/memfs/memfspb"
	"github.com/memoryfs/memfs/server/blockdir"
)

// BlockPriority orders the blocks a restore must fetch: lower first.
type BlockPriority func(fsm.BlockWant) int64

// SmallFilesFirst is the default BlockPriority: blocks of small files
// (which directories' worth of config and source trees are made of) come
// before the chunks of large ones, and a file's chunks come in order.
func SmallFilesFirst(w fsm.BlockWant) int64 { return int64(min(w.FileSize, 1<<62)) }

// Sync limits: blocks per FetchBlocks call, fetchers per peer. A batch
// goes round all peers syncMinRounds times before its blocks count as lost.
// When every peer answered and none held them, that is the end: they are
// gone (a snapshot's blocks collected once newer snapshots replaced it, and
// the leader will send a newer one). While some peer could not be asked,
// the rounds go on until syncGiveUp has passed: the peers that hold the
// blocks may be restarting too (a whole cluster after a power loss). A call
// that receives nothing for syncIdle is abandoned: on a lossy network a
// stream can stall for good.
const (
	syncBatchBlocks     = 256
	syncBatchBytes      = 8 << 20
	syncWorkersPer      = 2
	syncMaxWorkers      = 8
	syncMinRounds       = 3
	syncGiveUp          = 2 * time.Minute
	syncRoundBackoff    = 300 * time.Millisecond
	syncMaxRoundBackoff = 3 * time.Second
	syncIdle            = 5 * time.Second
)

// blockSync is a node's side of block sync: it answers peers from memory
// or the block directory, and it fetches what a restore lacks.
type blockSync struct {
	ctx      context.Context // the node's: ends when it stops
	id       string
	fsm      fsm.Applier
	dir      *blockdir.Dir // nil for an ephemeral node
	peers    *peers
	priority BlockPriority
	log      *slog.Logger
	giveUp   time.Duration // syncGiveUp; tests shorten it
	idle     time.Duration // syncIdle; tests shorten it

	restoring                                    atomic.Bool
	wantBlocks, wantBytes, gotBlocks, gotBytes   atomic.Uint64 // the current or last restore
	servedBytes, fetchedBytesTotal, corruptTotal atomic.Uint64
	fetchedBlocksTotal                           atomic.Uint64
}

// data returns block h from memory or disk, or nil.
func (b *blockSync) data(h block.Hash) []byte {
	if d := b.fsm.Block(h); d != nil {
		return d
	}
	if b.dir == nil || !b.dir.Has(h) {
		return nil
	}
	d, err := b.dir.Get(h)
	if errors.Is(err, blockdir.ErrCorrupt) { // counted by the directory
		b.log.Warn("corrupt block on disk removed", "block", h.Short())
	}
	return d
}

func (b *blockSync) has(h block.Hash) bool {
	return b.fsm.HasBlock(h) || (b.dir != nil && b.dir.Has(h))
}

func parseHashes(raw [][]byte) ([]block.Hash, error) {
	if len(raw) > pb.MaxSyncHashes {
		return nil, badRequest("%d hashes in one request, at most %d", len(raw), pb.MaxSyncHashes)
	}
	out := make([]block.Hash, len(raw))
	for i, r := range raw {
		h, err := block.ParseHash(r)
		if err != nil {
			return nil, badRequest("hash %d: %v", i, err)
		}
		out[i] = h
	}
	return out, nil
}

func (s *service) MissingBlocks(_ context.Context, req *pb.MissingBlocksRequest) (*pb.MissingBlocksResponse, error) {
	if err := checkVersion(req.GetVersion()); err != nil {
		return nil, err
	}
	hashes, err := parseHashes(req.GetHashes())
	if err != nil {
		return nil, err
	}
	resp := &pb.MissingBlocksResponse{}
	for i, h := range hashes {
		if !s.n.sync.has(h) {
			resp.Missing = append(resp.Missing, uint32(i))
		}
	}
	return resp, nil
}

func (s *service) FetchBlocks(req *pb.FetchBlocksRequest, stream grpc.ServerStreamingServer[pb.BlockFrame]) error {
	if err := checkVersion(req.GetVersion()); err != nil {
		return err
	}
	hashes, err := parseHashes(req.GetHashes())
	if err != nil {
		return err
	}
	for _, h := range hashes {
		data := s.n.sync.data(h)
		if data == nil {
			if err := stream.Send(&pb.BlockFrame{Hash: h[:], Absent: true}); err != nil {
				return err
			}
			continue
		}
		for off := 0; off < len(data); {
			piece := data[off:min(len(data), off+pb.MaxMessageData)]
			f := &pb.BlockFrame{Hash: h[:], Offset: uint64(off), Size: uint64(len(data)), Data: piece}
			if err := stream.Send(f); err != nil {
				return err
			}
			off += len(piece)
		}
		s.n.sync.servedBytes.Add(uint64(len(data)))
	}
	return nil
}

// source returns the BlockSource of one restore: the block directory
// first, then the peers named in members (node id -> API address).
func (b *blockSync) source(members map[string]string) fsm.BlockSource {
	var addrs []string
	for id, a := range members {
		if id != b.id && a != "" {
			addrs = append(addrs, a)
		}
	}
	slices.Sort(addrs)
	return &restoreSource{b: b, peers: addrs}
}

type restoreSource struct {
	b     *blockSync
	peers []string
}

// Blocks reads what it can from disk and fetches the rest from peers, in
// priority order, writing each fetched block to disk as it arrives so an
// interrupted restore keeps its progress.
func (s *restoreSource) Blocks(ctx context.Context, want []fsm.BlockWant) (map[block.Hash]*block.Block, error) {
	b := s.b
	b.restoring.Store(true)
	defer b.restoring.Store(false)
	slices.SortStableFunc(want, func(x, y fsm.BlockWant) int { return cmp.Compare(b.priority(x), b.priority(y)) })
	out := make(map[block.Hash]*block.Block, len(want))
	var remote []fsm.BlockWant
	var remoteBytes uint64
	for _, w := range want {
		if d := b.data(w.Hash); d != nil {
			out[w.Hash] = block.NewBlock(b.fsm.ChunkSize(), w.Hash, d)
			continue
		}
		remote = append(remote, w)
		remoteBytes += w.Size
	}
	if len(remote) == 0 {
		return out, nil // the counters keep describing the last transfer
	}
	b.wantBlocks.Store(uint64(len(remote)))
	b.wantBytes.Store(remoteBytes)
	b.gotBlocks.Store(0)
	b.gotBytes.Store(0)
	b.log.Info("restore fetching blocks from peers", "blocks", len(remote), "bytes", remoteBytes,
		"local_blocks", len(want)-len(remote), "peers", s.peers)
	if len(s.peers) == 0 {
		return nil, fmt.Errorf("%d blocks are not on this node and no peer is known: %w", len(remote), syscall.ENOENT)
	}
	f := &fetch{s: s, out: out}
	if err := f.run(ctx, remote); err != nil {
		return nil, err
	}
	if b.dir != nil {
		if err := b.dir.Sync(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// fetch is one restore's transfer from peers.
type fetch struct {
	s   *restoreSource
	mu  sync.Mutex
	out map[block.Hash]*block.Block // in block memory: held once, off the heap
}

// run asks every peer which blocks it lacks, deals the blocks out to the
// peers that hold them, and fetches them in parallel.
func (f *fetch) run(ctx context.Context, remote []fsm.BlockWant) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	holders := f.plan(ctx, remote)
	jobs := make(chan fetchJob)
	go func() {
		defer close(jobs)
		for _, j := range batches(remote, holders, len(f.s.peers)) {
			select {
			case jobs <- j:
			case <-ctx.Done():
				return
			}
		}
	}()
	workers := min(syncMaxWorkers, syncWorkersPer*len(f.s.peers))
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for j := range jobs {
				if err := f.job(ctx, j); err != nil {
					cancel(err)
				}
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return err
	}
	return nil
}

// plan returns, per block, a bitmask of the peers that said they hold it
// (all peers when a peer could not be asked: it is tried anyway).
func (f *fetch) plan(ctx context.Context, remote []fsm.BlockWant) []uint64 {
	peers := f.s.peers
	holders := make([]uint64, len(remote))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for p := range peers {
		if p >= 64 {
			break
		}
		wg.Go(func() {
			lacks, err := f.missingOn(ctx, peers[p], remote)
			mu.Lock()
			defer mu.Unlock()
			for i := range remote {
				if err != nil || !lacks[i] {
					holders[i] |= 1 << p
				}
			}
		})
	}
	wg.Wait()
	return holders
}

func (f *fetch) missingOn(ctx context.Context, addr string, remote []fsm.BlockWant) (map[int]bool, error) {
	cli, err := f.s.b.peers.client(addr)
	if err != nil {
		return nil, err
	}
	lacks := map[int]bool{}
	for start := 0; start < len(remote); start += pb.MaxSyncHashes {
		part := remote[start:min(len(remote), start+pb.MaxSyncHashes)]
		req := &pb.MissingBlocksRequest{Version: pb.Version}
		for _, w := range part {
			req.Hashes = append(req.Hashes, w.Hash[:])
		}
		cctx, cancel := context.WithTimeout(ctx, f.s.b.idle)
		resp, err := cli.MissingBlocks(cctx, req)
		cancel()
		if err != nil {
			return nil, err
		}
		for _, i := range resp.GetMissing() {
			lacks[start+int(i)] = true
		}
	}
	return lacks, nil
}

// fetchJob is a batch of blocks and the peers to try, first first.
type fetchJob struct {
	wants []fsm.BlockWant
	order []int
}

// batches cuts remote (already in priority order) into jobs, each
// preferring one peer that holds its blocks, rotating between holders so
// the load spreads.
func batches(remote []fsm.BlockWant, holders []uint64, npeers int) []fetchJob {
	var jobs []fetchJob
	open := map[int]int{} // preferred peer -> index of its open job
	next := 0
	for i, w := range remote {
		p := -1
		for k := range npeers {
			c := (next + k) % npeers
			if holders[i]&(1<<c) != 0 {
				p = c
				break
			}
		}
		if p < 0 {
			p = next % npeers // nobody admits to it: try everyone anyway
		}
		next = p + 1
		j, ok := open[p]
		if !ok || len(jobs[j].wants) >= syncBatchBlocks || batchBytes(jobs[j].wants)+w.Size > syncBatchBytes {
			order := []int{p}
			for k := 1; k < npeers; k++ {
				order = append(order, (p+k)%npeers)
			}
			jobs = append(jobs, fetchJob{order: order})
			j = len(jobs) - 1
			open[p] = j
		}
		jobs[j].wants = append(jobs[j].wants, w)
	}
	return jobs
}

func batchBytes(ws []fsm.BlockWant) (n uint64) {
	for _, w := range ws {
		n += w.Size
	}
	return n
}

// job fetches one batch, moving on to the next peer for whatever a peer
// did not deliver intact.
func (f *fetch) job(ctx context.Context, j fetchJob) error {
	left := j.wants
	start := time.Now()
	for round := 0; ; round++ {
		unreachable := false // some peer failed, rather than answer without the blocks
		for _, p := range j.order {
			if len(left) == 0 {
				return nil
			}
			var err error
			left, err = f.from(ctx, f.s.peers[p], left)
			if err != nil && ctx.Err() == nil {
				unreachable = true
				f.s.b.log.Warn("block fetch from peer failed", "peer", f.s.peers[p], "err", err, "left", len(left))
			}
		}
		if len(left) == 0 {
			return nil
		}
		if round+1 >= syncMinRounds && (!unreachable || time.Since(start) >= f.s.b.giveUp) {
			return fmt.Errorf("%d blocks (first %s) not delivered intact by any of %d peers in %d rounds: %w",
				len(left), left[0].Hash.Short(), len(f.s.peers), round+1, syscall.EIO)
		}
		select {
		case <-time.After(min(syncRoundBackoff*time.Duration(round+1), syncMaxRoundBackoff)):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// from fetches wants from one peer and returns those it did not deliver.
func (f *fetch) from(ctx context.Context, addr string, wants []fsm.BlockWant) ([]fsm.BlockWant, error) {
	cli, err := f.s.b.peers.client(addr)
	if err != nil {
		return wants, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	idle := time.AfterFunc(f.s.b.idle, func() { cancel(errStalled) })
	defer idle.Stop()
	req := &pb.FetchBlocksRequest{Version: pb.Version}
	for _, w := range wants {
		req.Hashes = append(req.Hashes, w.Hash[:])
	}
	stream, err := cli.FetchBlocks(ctx, req)
	if err != nil {
		return wants, err
	}
	var left []fsm.BlockWant
	i := 0
	for ; i < len(wants); i++ {
		data, err := recvBlock(stream, wants[i])
		idle.Reset(f.s.b.idle)
		if context.Cause(ctx) == errStalled {
			err = fmt.Errorf("%w for %v", errStalled, f.s.b.idle)
		}
		if errors.Is(err, errBadBlock) {
			f.s.b.corruptTotal.Add(1)
		}
		if err != nil {
			return append(left, wants[i:]...), err
		}
		if data == nil {
			left = append(left, wants[i])
			continue
		}
		if err := f.deliver(wants[i], data); err != nil {
			return append(left, wants[i:]...), err
		}
	}
	return left, nil
}

var (
	errBadBlock = errors.New("block does not match its hash")
	errStalled  = errors.New("block stream stalled: nothing received")
)

// recvBlock reads one block's frames. It returns nil data for a block the
// peer does not hold or sent corrupt (counted; fetched elsewhere).
func recvBlock(stream grpc.ServerStreamingClient[pb.BlockFrame], w fsm.BlockWant) ([]byte, error) {
	var data []byte
	for {
		fr, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("stream ended before block %s: %w", w.Hash.Short(), io.ErrUnexpectedEOF)
		}
		if err != nil {
			return nil, err
		}
		h, err := block.ParseHash(fr.GetHash())
		switch {
		case err != nil || h != w.Hash:
			return nil, fmt.Errorf("peer sent block %x, want %s", fr.GetHash(), w.Hash.Short())
		case fr.GetAbsent():
			return nil, nil
		case fr.GetSize() != w.Size || fr.GetOffset() != uint64(len(data)) || uint64(len(data)+len(fr.GetData())) > w.Size:
			return nil, fmt.Errorf("block %s: frame at %d of %d bytes (block %d), want %d bytes: %w",
				w.Hash.Short(), fr.GetOffset(), len(fr.GetData()), fr.GetSize(), w.Size, errBadBlock)
		}
		switch {
		case data == nil && uint64(len(fr.GetData())) == w.Size:
			data = fr.GetData() // the whole block in one frame: no copy
		case data == nil:
			data = append(make([]byte, 0, w.Size), fr.GetData()...)
		default:
			data = append(data, fr.GetData()...)
		}
		if uint64(len(data)) == w.Size {
			if block.Sum(data) != w.Hash {
				return nil, fmt.Errorf("block %s from peer: %w", w.Hash.Short(), errBadBlock)
			}
			return data, nil
		}
	}
}

// deliver keeps a verified block and writes it to disk.
func (f *fetch) deliver(w fsm.BlockWant, data []byte) error {
	b := f.s.b
	if b.dir != nil {
		if err := b.dir.PutBlock(w.Hash, data); err != nil {
			return err
		}
	}
	blk := block.NewBlock(b.fsm.ChunkSize(), w.Hash, data)
	f.mu.Lock()
	f.out[w.Hash] = blk
	f.mu.Unlock()
	b.gotBlocks.Add(1)
	b.gotBytes.Add(w.Size)
	b.fetchedBytesTotal.Add(w.Size)
	b.fetchedBlocksTotal.Add(1)
	return nil
}

// fillStatus reports sync progress and the block directory in ns.
func (b *blockSync) fillStatus(ns *pb.NodeStatus) {
	ns.SyncBlocksWanted, ns.SyncBlocksFetched = b.wantBlocks.Load(), b.gotBlocks.Load()
	ns.SyncBytesWanted, ns.SyncBytesFetched = b.wantBytes.Load(), b.gotBytes.Load()
	ns.Restoring = b.restoring.Load()
	ns.SyncBytesServed, ns.SyncBytesFetchedTotal = b.servedBytes.Load(), b.fetchedBytesTotal.Load()
	ns.SyncBlocksFetchedTotal = b.fetchedBlocksTotal.Load()
	ns.SyncCorruptBlocks = b.corruptTotal.Load()
	if b.dir != nil {
		st := b.dir.Stats()
		ns.DiskBlocks, ns.DiskBytes, ns.DiskBytesWritten = st.Blocks, st.Bytes, st.Written
		ns.SyncCorruptBlocks += st.Corrupt
	}
}
