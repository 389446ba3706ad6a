package client

import (
	"context"
	"errors"
	"io/fs"
	"slices"
	"syscall"
	"time"

	pb "github.com/memoryfs/memfs/memfspb"
)

// This file is the inode-level API that a FUSE file system builds on. Its
// handles are client handles: numbers this Client hands out for the
// handles the state machine issues. A handle belongs to the session that
// opened it; when that session expires (the client was cut off for a whole
// lease) every operation on the handle fails with ESTALE, and it only
// remains to close it.

// waitPoll is how long one HandleQuery waits for an exclusive open to be
// granted before asking again.
const waitPoll = 10 * time.Second

// openLinux values of the open flags, which the protocol uses on every OS.
const (
	linuxWRONLY = 0x1
	linuxRDWR   = 0x2
	linuxCREAT  = 0x40
	linuxEXCL   = 0x80
	linuxTRUNC  = 0x200
	linuxAPPEND = 0x400
)

// Do runs one mutating command: it fills in the command's session, seq and
// ack (so cmd must not be shared with a concurrent Do), sends it to the
// leader and retries it with the same seq until it is answered or ctx is
// done; the state machine applies it at most once. Handles in cmd and in
// the result of an OpenCmd are client handles. A write of more than
// pb.MaxMessageData is streamed. When the result carries an errno the
// error is an *fs.PathError wrapping the syscall.Errno, and the result is
// returned too.
func (c *Client) Do(ctx context.Context, cmd *pb.Command) (*pb.Result, error) {
	op, name := opName(cmd), locName(cmdLoc(cmd))
	sc, ref, err := c.k.bind(cmd)
	if err != nil {
		return nil, pathErr(op, name, err)
	}
	var data []byte
	if w := sc.GetWrite(); len(w.GetData()) > pb.MaxMessageData {
		if len(w.GetData()) > MaxStreamWrite {
			return nil, pathErr(op, name, syscall.EFBIG)
		}
		data = w.Data
		sc = &pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{
			Handle: w.Handle, Loc: w.Loc, Offset: w.Offset, Append: w.Append, Length: uint64(len(data)),
		}}}
	}
	res, err := c.k.applyData(ctx, sc, data, ref.session)
	if sc != cmd {
		cmd.Session, cmd.Seq, cmd.Ack = sc.Session, sc.Seq, sc.Ack
	}
	if err != nil {
		return nil, pathErr(op, name, err)
	}
	c.k.afterApply(cmd, res)
	return res, pathErr(op, name, errnoErr(res))
}

// bind returns cmd with its client handle replaced by the server's, and
// what the handle stands for. A command without a handle is returned as is.
func (k *core) bind(cmd *pb.Command) (*pb.Command, handleRef, error) {
	switch op := cmd.GetOp().(type) {
	case *pb.Command_Close:
		r, err := k.ref(op.Close.GetHandle())
		if err != nil {
			return nil, r, err
		}
		return &pb.Command{Op: &pb.Command_Close{Close: &pb.CloseCmd{Handle: r.server}}}, r, nil
	case *pb.Command_Write:
		w := op.Write
		if w.GetHandle() == 0 {
			return cmd, handleRef{}, nil
		}
		r, err := k.ref(w.GetHandle())
		if err != nil {
			return nil, r, err
		}
		return &pb.Command{Op: &pb.Command_Write{Write: &pb.WriteCmd{
			Handle: r.server, Loc: w.Loc, Offset: w.Offset, Data: w.Data,
			Append: w.Append || r.append, Hashes: w.Hashes, Length: w.Length,
		}}}, r, nil
	case *pb.Command_SetAttr:
		s := op.SetAttr
		if s.GetHandle() == 0 {
			return cmd, handleRef{}, nil
		}
		r, err := k.ref(s.GetHandle())
		if err != nil {
			return nil, r, err
		}
		return &pb.Command{Op: &pb.Command_SetAttr{SetAttr: &pb.SetAttrCmd{
			Loc: s.Loc, Valid: s.Valid, Mode: s.Mode, Uid: s.Uid, Gid: s.Gid, Size: s.Size,
			AtimeNs: s.AtimeNs, MtimeNs: s.MtimeNs, Handle: r.server,
		}}}, r, nil
	}
	return cmd, handleRef{}, nil
}

// ref looks a client handle up; an unknown one is EBADF.
func (k *core) ref(handle uint64) (handleRef, error) {
	r, ok := k.handles.get(handle)
	if !ok {
		return r, syscall.EBADF
	}
	return r, nil
}

// afterApply keeps the handle table in step with what a command did:
// an open adds a handle (rewriting the result's to the client handle), a
// close removes one, whatever its outcome, since the handle is unusable
// after either.
func (k *core) afterApply(cmd *pb.Command, res *pb.Result) {
	switch op := cmd.GetOp().(type) {
	case *pb.Command_Open:
		if res.GetErrno() == 0 && res.GetHandle() != 0 {
			res.Handle = k.handles.add(handleRef{
				session: cmd.Session, server: res.Handle,
				append: op.Open.GetFlags()&linuxAPPEND != 0,
			})
		}
	case *pb.Command_Close:
		k.handles.remove(op.Close.GetHandle())
	}
}

// Query runs one read. Handles in q are client handles. Consistency is the
// client's (WithConsistency). When the result carries an errno the error
// is an *fs.PathError wrapping the syscall.Errno, and the result is
// returned too.
func (c *Client) Query(ctx context.Context, q *pb.Query) (*pb.Result, error) {
	op, loc := queryName(q)
	name := locName(loc)
	switch v := q.GetQ().(type) {
	case *pb.Query_Read:
		if h := v.Read.GetHandle(); h != 0 {
			r, err := c.k.ref(h)
			if err != nil {
				return nil, pathErr(op, name, err)
			}
			rq := v.Read
			q = &pb.Query{Q: &pb.Query_Read{Read: &pb.ReadQuery{Handle: r.server, Loc: rq.Loc, Offset: rq.Offset, Length: rq.Length}}}
		}
	case *pb.Query_Handle:
		r, err := c.k.ref(v.Handle.GetHandle())
		if err != nil {
			return nil, pathErr(op, name, err)
		}
		q = &pb.Query{Q: &pb.Query_Handle{Handle: &pb.HandleQuery{Session: r.session, Handle: r.server, Wait: v.Handle.GetWait()}}}
	}
	res, err := c.k.query(ctx, q, callOpts{op: op})
	if err != nil {
		return nil, pathErr(op, name, err)
	}
	return res, pathErr(op, name, errnoErr(res))
}

// stat answers a StatQuery for loc.
func (c *Client) stat(ctx context.Context, op string, loc *pb.Loc) (*pb.Attr, error) {
	res, err := c.Query(ctx, &pb.Query{Q: &pb.Query_Stat{Stat: &pb.StatQuery{Loc: loc}}})
	if err != nil {
		if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
			pe.Op = op
		}
		return nil, err
	}
	return res.GetAttr(), nil
}

// Lookup returns the attributes of the entry name in directory parent,
// without following a symlink.
func (c *Client) Lookup(ctx context.Context, parent uint64, name string) (*pb.Attr, error) {
	return c.stat(ctx, "lookup", &pb.Loc{Parent: parent, Name: name, Nofollow: true})
}

// GetAttr returns the attributes of inode ino.
func (c *Client) GetAttr(ctx context.Context, ino uint64) (*pb.Attr, error) {
	return c.stat(ctx, "getattr", &pb.Loc{Ino: ino})
}

// SetAttr changes the attributes set.Valid names (through set.Handle, a
// client handle, when it is not 0) and returns the new attributes.
func (c *Client) SetAttr(ctx context.Context, set *pb.SetAttrCmd) (*pb.Attr, error) {
	res, err := c.Do(ctx, &pb.Command{Op: &pb.Command_SetAttr{SetAttr: set}})
	if err != nil {
		return nil, err
	}
	return res.GetAttr(), nil
}

// OpenLoc opens (and with O_CREAT maybe creates) the file at loc. flags
// are Linux open flags (O_WRONLY 0x1, O_RDWR 0x2, O_CREAT 0x40, O_EXCL 0x80,
// O_TRUNC 0x200, O_APPEND 0x400); mode, uid and gid apply to a created
// file. exclusive asks for the MemoryFS exclusive open: when another
// handle holds the file, the open fails with EWOULDBLOCK, or, with wait,
// queues in FIFO order and returns once granted (if ctx ends first, the
// queued open is withdrawn and the error wraps ctx.Err()). It returns a
// client handle for the Read/Write/CloseHandle methods, and the file's
// attributes.
func (c *Client) OpenLoc(ctx context.Context, loc *pb.Loc, flags, mode, uid, gid uint32, exclusive, wait bool) (uint64, *pb.Attr, error) {
	cmd := &pb.Command{Op: &pb.Command_Open{Open: &pb.OpenCmd{
		Loc: loc, Flags: flags, Mode: mode, Uid: uid, Gid: gid, Exclusive: exclusive, Wait: exclusive && wait,
	}}}
	res, err := c.Do(ctx, cmd)
	if err != nil {
		return 0, nil, err
	}
	if !res.GetQueued() {
		return res.GetHandle(), res.GetAttr(), nil
	}
	attr, err := c.waitGranted(ctx, res.GetHandle(), loc)
	if err != nil {
		return 0, nil, err
	}
	if attr == nil {
		attr = res.GetAttr()
	}
	return res.GetHandle(), attr, nil
}

// waitGranted waits until the queued exclusive open handle is granted. If
// ctx ends first it withdraws the open.
func (c *Client) waitGranted(ctx context.Context, handle uint64, loc *pb.Loc) (*pb.Attr, error) {
	q := &pb.Query{Q: &pb.Query_Handle{Handle: &pb.HandleQuery{Handle: handle, Wait: true}}}
	for {
		if ctx.Err() != nil {
			c.withdraw(handle)
			return nil, pathErr("open", locName(loc), ctx.Err())
		}
		wctx, cancel := context.WithTimeout(ctx, waitPoll)
		res, err := c.Query(wctx, q)
		cancel()
		switch {
		case err == nil && !res.GetQueued():
			return res.GetAttr(), nil
		case err == nil || errors.Is(err, ErrUnavailable):
			// Still queued, or the poll ran out: ask again.
		default:
			c.withdraw(handle)
			if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
				pe.Op, pe.Path = "open", locName(loc)
			}
			return nil, err
		}
	}
}

// withdraw closes a handle the caller will never see, on a context of its
// own since the caller's is done.
func (c *Client) withdraw(handle uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), c.k.cfg.retryTimeout)
	defer cancel()
	if err := c.CloseHandle(ctx, handle); err != nil {
		c.k.cfg.log.Warn("memfs: could not withdraw a queued exclusive open", "err", err)
	}
}

// CloseHandle closes a client handle, releasing its exclusive open if it
// holds one. The handle is gone afterwards even if an error is returned.
func (c *Client) CloseHandle(ctx context.Context, handle uint64) error {
	_, err := c.Do(ctx, &pb.Command{Op: &pb.Command_Close{Close: &pb.CloseCmd{Handle: handle}}})
	c.k.handles.remove(handle)
	return err
}

// WriteHandle writes p at off through handle (at the end of the file if
// the handle was opened with O_APPEND) and returns the bytes written and
// the file's attributes afterwards. Up to pb.MaxMessageData goes in one
// command, up to MaxStreamWrite in one streamed command, more in several.
// Each command is committed when it returns.
func (c *Client) WriteHandle(ctx context.Context, handle uint64, off int64, p []byte) (int, *pb.Attr, error) {
	return c.writeHandle(ctx, handle, off, p, false)
}

func (c *Client) writeHandle(ctx context.Context, handle uint64, off int64, p []byte, appendMode bool) (int, *pb.Attr, error) {
	r, err := c.k.ref(handle)
	if err != nil {
		return 0, nil, pathErr("write", "handle", err)
	}
	w := &pb.WriteCmd{Handle: r.server, Offset: off, Append: appendMode || r.append}
	n, attr, err := c.k.write(ctx, w, p, r.session)
	return n, attr, pathErr("write", "handle", err)
}

// WriteIno writes p at off into the regular file ino without a handle (like
// pwrite on a path).
func (c *Client) WriteIno(ctx context.Context, ino uint64, off int64, p []byte) (int, *pb.Attr, error) {
	loc := &pb.Loc{Ino: ino}
	n, attr, err := c.k.write(ctx, &pb.WriteCmd{Loc: loc, Offset: off}, p, 0)
	return n, attr, pathErr("write", locName(loc), err)
}

// AppendIno writes p at the end of the regular file ino, wherever the end
// is when the command applies (O_APPEND without a handle).
func (c *Client) AppendIno(ctx context.Context, ino uint64, p []byte) (int, *pb.Attr, error) {
	loc := &pb.Loc{Ino: ino}
	n, attr, err := c.k.write(ctx, &pb.WriteCmd{Loc: loc, Append: true}, p, 0)
	return n, attr, pathErr("write", locName(loc), err)
}

// ReadHandle reads into p from off through handle. It returns fewer than
// len(p) bytes only at the end of the file, with a nil error. Reads over
// pb.MaxMessageData are streamed.
func (c *Client) ReadHandle(ctx context.Context, handle uint64, off int64, p []byte) (int, error) {
	r, err := c.k.ref(handle)
	if err != nil {
		return 0, pathErr("read", "handle", err)
	}
	if cur := c.k.sess.Load(); cur.id != r.session {
		return 0, pathErr("read", "handle", syscall.ESTALE)
	}
	n, err := c.k.read(ctx, &pb.ReadQuery{Handle: r.server, Offset: off}, p)
	return n, pathErr("read", "handle", err)
}

// ReadIno reads into p from off of the regular file ino without a handle.
// It returns fewer than len(p) bytes only at the end of the file.
func (c *Client) ReadIno(ctx context.Context, ino uint64, off int64, p []byte) (int, error) {
	loc := &pb.Loc{Ino: ino}
	n, err := c.k.read(ctx, &pb.ReadQuery{Loc: loc, Offset: off}, p)
	return n, pathErr("read", locName(loc), err)
}

// SeekIno answers lseek(2)'s SEEK_DATA (hole false) or SEEK_HOLE (hole
// true) from off in regular file ino, as the cluster has it: where the
// next data or hole starts, or ENXIO (pb.SeekQuery). A hole is a chunk
// with no block stored, so data is found a chunk at a time.
func (c *Client) SeekIno(ctx context.Context, ino uint64, off int64, hole bool) (int64, error) {
	res, err := c.Query(ctx, &pb.Query{Q: &pb.Query_Seek{Seek: &pb.SeekQuery{Loc: &pb.Loc{Ino: ino}, Offset: off, Hole: hole}}})
	if err != nil {
		return 0, err
	}
	return int64(res.GetN()), nil
}

// ReadDirIno lists directory ino, following cookies until the end.
func (c *Client) ReadDirIno(ctx context.Context, ino uint64) ([]*pb.Dirent, error) {
	ents, _, err := c.readDir(ctx, &pb.Loc{Ino: ino}, false)
	return ents, err
}

// ReadDirPlusIno lists directory ino with each entry's attributes
// (Dirent.Attr), as of the query that returned its page. A node that
// predates the plus flag answers without them: Attr is then nil.
func (c *Client) ReadDirPlusIno(ctx context.Context, ino uint64) ([]*pb.Dirent, error) {
	ents, _, err := c.readDir(ctx, &pb.Loc{Ino: ino}, true)
	return ents, err
}

// readDir lists loc page by page and returns the listed directory's inode
// (0 from a node too old to name it). The first page is asked for by loc;
// the node answers with the directory's attributes, and later pages ask for
// that inode, so a listing by path is of one directory even if the path is
// renamed meanwhile.
func (c *Client) readDir(ctx context.Context, loc *pb.Loc, plus bool) ([]*pb.Dirent, uint64, error) {
	var out []*pb.Dirent
	var dir uint64
	cookie := ""
	for {
		res, err := c.Query(ctx, &pb.Query{Q: &pb.Query_ReadDir{ReadDir: &pb.ReadDirQuery{Loc: loc, Cookie: cookie, Plus: plus}}})
		if err != nil {
			return nil, 0, err
		}
		if dir == 0 {
			if dir = res.GetAttr().GetIno(); dir != 0 {
				loc = &pb.Loc{Ino: dir}
			}
		}
		ents := res.GetEntries()
		out = append(out, ents...)
		next := res.GetCookie()
		if next == "" && len(ents) > 0 {
			next = ents[len(ents)-1].GetName()
		}
		if res.GetEof() || len(ents) == 0 || next == cookie {
			break
		}
		cookie = next
	}
	out = slices.DeleteFunc(out, func(d *pb.Dirent) bool { return d.GetName() == "." || d.GetName() == ".." })
	return out, dir, nil
}

// Statfs returns the file system's totals.
func (c *Client) Statfs(ctx context.Context) (*pb.Statfs, error) {
	res, err := c.Query(ctx, &pb.Query{Q: &pb.Query_Statfs{Statfs: &pb.StatfsQuery{}}})
	if err != nil {
		return nil, err
	}
	return res.GetStatfs(), nil
}
