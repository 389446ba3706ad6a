package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	pb "github.com/memoryfs/memfs/memfspb"
)

// MaxStreamWrite is the most data one write command carries. A larger
// write is split into commands of this size, each atomic on its own.
const MaxStreamWrite = 64 << 20

// streamLimit is MaxStreamWrite, lowered by tests to exercise splitting
// without moving 64 MiB.
var streamLimit = MaxStreamWrite

// maxStaleRenewals bounds how often one command is re-run under a new
// session; more means sessions expire as fast as they are opened.
const maxStaleRenewals = 3

// core is the state one Client and all its WithContext copies share.
type core struct {
	cfg     config
	t       *transport
	seqs    *seqTracker
	handles handleTable

	sessMu sync.Mutex // held while a session is opened, so one opens at a time
	sess   atomic.Pointer[session]

	caps    *Caps                   // nil unless WithCaps
	journal atomic.Pointer[Journal] // nil unless StartJournal

	commands, queries atomic.Int64 // calls made (Client.Calls)

	stop      context.CancelFunc // stops the keepalive
	done      chan struct{}      // closed when the keepalive has stopped
	closeOnce sync.Once
	closeErr  error
}

// apply runs one command in the current session: it fills in session, seq
// and ack, sends it with retries and returns its result. bound is the
// session the command's handle belongs to (0 if it names none); when that
// session is no longer current the command is not sent and the result is
// ESTALE. A command that meets an expired session is re-run in a new one
// only when no earlier attempt could have been applied.
func (k *core) apply(ctx context.Context, cmd *pb.Command, bound uint64) (*pb.Result, error) {
	return k.applyData(ctx, cmd, nil, bound)
}

// applyData is apply for a write whose data (when not nil) is streamed
// through the Write RPC rather than carried in the command.
func (k *core) applyData(ctx context.Context, cmd *pb.Command, data []byte, bound uint64) (*pb.Result, error) {
	if err := k.settleCommand(ctx, cmd); err != nil {
		return nil, err
	}
	for renewals := 0; ; renewals++ {
		s := k.sess.Load()
		if bound != 0 && bound != s.id {
			return &pb.Result{Errno: uint32(syscall.ESTALE), Message: "the session of this handle expired"}, nil
		}
		cmd.Session = s.id
		var attempts int
		var res *pb.Result
		var err error
		cmd.Seq, cmd.Ack = k.seqs.begin()
		if data == nil {
			res, attempts, err = k.send(ctx, cmd)
		} else {
			res, attempts, err = k.sendStream(ctx, cmd, data)
		}
		k.seqs.end(cmd.Seq)
		if err != nil || res.GetErrno() != uint32(syscall.ESTALE) {
			return res, err
		}
		k.renew(ctx, s.id)
		if bound != 0 || attempts > 1 || renewals >= maxStaleRenewals {
			return res, nil
		}
	}
}

// send makes the Apply RPC for cmd with retries. It reports how many
// attempts it made.
func (k *core) send(ctx context.Context, cmd *pb.Command) (*pb.Result, int, error) {
	req := &pb.ApplyRequest{Version: pb.Version, Command: cmd}
	var resp *pb.ApplyResponse
	o := callOpts{op: opName(cmd), bytes: len(cmd.GetWrite().GetData()), leader: true}
	if s := k.sess.Load(); cmd.GetKeepAlive() != nil && s != nil {
		// An attempt that a quarter of a lease does not see answered is
		// tried again (at the leader another may know of by then).
		o.renewal, o.timeout = true, s.lease/4
	}
	sent := time.Now()
	k.commands.Add(1)
	n, err := k.t.call(ctx, o, func(ctx context.Context, api pb.MemFSClient) (metadata.MD, error) {
		var md metadata.MD
		r, err := api.Apply(ctx, req, grpc.Trailer(&md))
		resp = r
		return md, err
	})
	if err != nil {
		return nil, n, err
	}
	k.answered(cmd, sent, resp)
	return resultOf(resp), n, nil
}

// sendStream makes the Write RPC: the command first, then data in frames
// of at most pb.MaxMessageData. The node applies it only once the whole
// stream has arrived, so a broken attempt changes nothing.
func (k *core) sendStream(ctx context.Context, cmd *pb.Command, data []byte) (*pb.Result, int, error) {
	var resp *pb.ApplyResponse
	o := callOpts{op: "write", bytes: len(data), leader: true}
	sent := time.Now()
	k.commands.Add(1)
	defer func() {
		if resp != nil {
			k.answered(cmd, sent, resp)
		}
	}()
	n, err := k.t.call(ctx, o, func(ctx context.Context, api pb.MemFSClient) (metadata.MD, error) {
		st, err := api.Write(ctx)
		if err != nil {
			return nil, err
		}
		if err := sendFrames(st, cmd, data); err != nil {
			return st.Trailer(), err
		}
		r, err := st.CloseAndRecv()
		resp = r
		return st.Trailer(), err
	})
	if err != nil {
		return nil, n, err
	}
	return resultOf(resp), n, nil
}

func sendFrames(st grpc.ClientStreamingClient[pb.WriteFrame, pb.ApplyResponse], cmd *pb.Command, data []byte) error {
	send := func(f *pb.WriteFrame) error {
		err := st.Send(f)
		if errors.Is(err, io.EOF) {
			// The node ended the stream; its status says why.
			_, err = st.CloseAndRecv()
			if err == nil {
				err = errors.New("node ended the write stream early")
			}
		}
		return err
	}
	if err := send(&pb.WriteFrame{Version: pb.Version, Command: cmd}); err != nil {
		return err
	}
	for off := 0; off < len(data); off += pb.MaxMessageData {
		if err := send(&pb.WriteFrame{Data: data[off:min(off+pb.MaxMessageData, len(data))]}); err != nil {
			return err
		}
	}
	return nil
}

// answered tells the capability table that cmd, sent at sent, renewed
// the session at the log index resp names.
func (k *core) answered(cmd *pb.Command, sent time.Time, resp *pb.ApplyResponse) {
	if k.caps != nil && resp.GetIndex() != 0 && resp.GetResult().GetErrno() != uint32(syscall.ESTALE) {
		k.caps.answered(sent, resp.GetIndex())
	}
}

func resultOf(r interface{ GetResult() *pb.Result }) *pb.Result {
	if res := r.GetResult(); res != nil {
		return res
	}
	return &pb.Result{}
}

// query makes the Query RPC with retries.
func (k *core) query(ctx context.Context, q *pb.Query, o callOpts) (*pb.Result, error) {
	if err := k.settleQuery(ctx, q); err != nil {
		return nil, err
	}
	req := &pb.QueryRequest{Version: pb.Version, Query: q, Consistency: k.cfg.consistency, Session: k.sess.Load().id}
	o.leader = k.cfg.consistency == pb.Consistency_LINEARIZABLE
	k.queries.Add(1)
	var resp *pb.QueryResponse
	_, err := k.t.call(ctx, o, func(ctx context.Context, api pb.MemFSClient) (metadata.MD, error) {
		var md metadata.MD
		r, err := api.Query(ctx, req, grpc.Trailer(&md))
		resp = r
		return md, err
	})
	if err != nil {
		return nil, err
	}
	return resultOf(resp), nil
}

// write writes data at off through a server handle (or at w's loc when
// the handle is 0): in one Apply up to pb.MaxMessageData, streamed above,
// in commands of MaxStreamWrite beyond that. It returns the bytes written
// and the attributes after the last command.
func (k *core) write(ctx context.Context, w *pb.WriteCmd, data []byte, bound uint64) (int, *pb.Attr, error) {
	if len(data) <= pb.MaxMessageData {
		cmd := &pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{
			Handle: w.Handle, Loc: w.Loc, Offset: w.Offset, Append: w.Append, Data: data,
		}}}
		res, err := k.apply(ctx, cmd, bound)
		if err != nil {
			return 0, nil, err
		}
		return writeResult(res, len(data))
	}
	done := 0
	var attr *pb.Attr
	for done < len(data) {
		piece := data[done:min(done+streamLimit, len(data))]
		// Length tells the node how much data follows, so it can size its
		// buffer once.
		cmd := &pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{
			Handle: w.Handle, Loc: w.Loc, Offset: w.Offset + int64(done), Append: w.Append,
			Length: uint64(len(piece)),
		}}}
		res, err := k.applyData(ctx, cmd, piece, bound)
		if err != nil {
			return done, attr, err
		}
		n, a, err := writeResult(res, len(piece))
		done += n
		if a != nil {
			attr = a
		}
		if err != nil {
			return done, attr, err
		}
	}
	return done, attr, nil
}

// writeResult turns a write's result into (bytes written, attr, errno).
func writeResult(res *pb.Result, want int) (int, *pb.Attr, error) {
	if res.GetErrno() != 0 {
		return 0, res.GetAttr(), errnoErr(res)
	}
	n := int(res.GetN())
	if n == 0 && want > 0 {
		// A node that does not report n wrote everything or failed.
		n = want
	}
	return n, res.GetAttr(), nil
}

// read fills p from r.Offset through a server handle (or r's loc when the
// handle is 0). It returns fewer than len(p) bytes only at the end of the
// file.
func (k *core) read(ctx context.Context, r *pb.ReadQuery, p []byte) (int, error) {
	n := 0
	for n < len(p) {
		q := &pb.ReadQuery{Handle: r.Handle, Loc: r.Loc, Offset: r.Offset + int64(n), Length: int64(len(p) - n)}
		var got int
		var eof bool
		var err error
		if len(p)-n <= pb.MaxMessageData {
			got, eof, err = k.readOnce(ctx, q, p[n:])
		} else {
			got, eof, err = k.readStream(ctx, q, p[n:])
		}
		n += got
		if err != nil || eof || got == 0 {
			return n, err
		}
	}
	return n, nil
}

func (k *core) readOnce(ctx context.Context, q *pb.ReadQuery, p []byte) (int, bool, error) {
	data, eof, err := k.readData(ctx, q) // q.Length is len(p)
	if err != nil {
		return 0, false, err
	}
	return copy(p, data), eof, nil
}

// readData is one Query read of at most q.Length bytes; it returns the
// answer's own bytes, so that a caller without a buffer of its own makes
// none.
func (k *core) readData(ctx context.Context, q *pb.ReadQuery) ([]byte, bool, error) {
	res, err := k.query(ctx, &pb.Query{Q: &pb.Query_Read{Read: q}}, callOpts{op: "read"})
	if err != nil {
		return nil, false, err
	}
	if res.GetErrno() != 0 {
		return nil, false, errnoErr(res)
	}
	if int64(len(res.GetData())) > q.Length {
		return nil, false, errors.New("node sent more read data than asked for")
	}
	// A node may answer a long read short (it caps what one reply
	// carries); only eof says the file ended.
	return res.GetData(), res.GetEof(), nil
}

// readStream reads p through the Read RPC. A stream that breaks is resumed
// from the first byte not yet received.
func (k *core) readStream(ctx context.Context, q *pb.ReadQuery, p []byte) (int, bool, error) {
	n := 0
	var eof bool
	var errno *pb.Result
	o := callOpts{op: "read", bytes: len(p), leader: k.cfg.consistency == pb.Consistency_LINEARIZABLE}
	if err := k.settleQuery(ctx, &pb.Query{Q: &pb.Query_Read{Read: q}}); err != nil {
		return 0, false, err
	}
	k.queries.Add(1)
	_, err := k.t.call(ctx, o, func(ctx context.Context, api pb.MemFSClient) (metadata.MD, error) {
		req := &pb.QueryRequest{Version: pb.Version, Consistency: k.cfg.consistency, Session: k.sess.Load().id, Query: &pb.Query{Q: &pb.Query_Read{Read: &pb.ReadQuery{
			Handle: q.Handle, Loc: q.Loc, Offset: q.Offset + int64(n), Length: int64(len(p) - n),
		}}}}
		st, err := api.Read(ctx, req)
		if err != nil {
			return nil, err
		}
		for {
			f, err := st.Recv()
			if errors.Is(err, io.EOF) {
				return st.Trailer(), nil
			}
			if err != nil {
				return st.Trailer(), err
			}
			if r := f.GetResult(); r != nil {
				if r.GetErrno() != 0 {
					errno = r
					return nil, nil
				}
				eof = eof || r.GetEof()
			}
			if len(f.GetData()) > len(p)-n {
				return nil, fmt.Errorf("node sent more read data than asked for")
			}
			n += copy(p[n:], f.GetData())
		}
	})
	if err != nil {
		return n, false, err
	}
	if errno != nil {
		return n, false, errnoErr(errno)
	}
	return n, eof, nil
}
