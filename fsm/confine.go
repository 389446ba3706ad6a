package fsm

import (
	"errors"
	"path"
	"strings"
	"syscall"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/memoryfs/memfs/memfspb"
)

// Confinement. A client may be confined to a directory, its token's or
// certificate's path, which the node that takes its request stamps in the
// command (Command.root) or query (Query.root) as it stamps the owner.
// The state machine resolves that path from the real root when the
// command or query runs (so a confinement follows the path, not an inode
// that was renamed away), and then, for that one request:
//
//   - every path starts at the directory, and ".." stops there, in the
//     path given and in the targets of the symlinks it follows: a chroot;
//   - every inode named by number (a Loc's ino or parent, a grant, a lock)
//     must lie inside: a directory whose parents lead to the root
//     directory, or a file with at least one name in such a directory
//     (names.go: a file's parent field, or for a file with names in
//     several directories the links index), or a file without a name
//     that a session of the same client holds open. Anything else is
//     EACCES;
//   - a handle must be one of the client's own sessions' (commands check
//     that for every client; a confined query checks the handle's owner);
//   - inode numbers 1 and the directory's are swapped in the request and
//     the result, so the client sees its directory as the root, inode 1,
//     and never learns the real root's number.
//
// The check costs a walk up the parent pointers (a few tree lookups per
// level) for a request that names an inode by number; reads and writes
// through a handle cost one lookup of the handle's session. A published
// state never has a confinement: it is set on a private copy (a query's)
// or for one command of a transaction.

// confinement is the running request's.
type confinement struct {
	root  uint64 // the directory the client sees as "/"
	owner string // the client's identity (Command.owner)
}

// rootIno returns the inode number the running request sees as the root.
func (s *state) rootOf() uint64 {
	if s.conf != nil {
		return s.conf.root
	}
	return rootIno
}

// CheckRoot validates a confinement path: absolute, clean, not the root
// itself, and short enough to resolve.
func CheckRoot(p string) error {
	switch {
	case len(p) > maxPathLen:
		return errf(syscall.ENAMETOOLONG, "path of %d bytes", len(p))
	case strings.IndexByte(p, 0) >= 0:
		return errf(syscall.EINVAL, "path %q contains NUL", p)
	case !strings.HasPrefix(p, "/") || path.Clean(p) != p:
		return errf(syscall.EINVAL, "path %q is not absolute and clean (like /tenants/a)", p)
	case p == "/":
		return errf(syscall.EINVAL, "path / confines nothing: give none")
	}
	return nil
}

// confineTo resolves a confinement path from the real root, following
// symlinks; it must lead to a directory.
func (s *state) confineTo(root, owner string) (*confinement, error) {
	if err := CheckRoot(root); err != nil {
		return nil, err
	}
	w := &walker{s: s}
	r, err := w.walk(s.inode(rootIno), root, true)
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			return nil, errf(e.Errno, "confinement %s: %s", root, e.Msg)
		}
		return nil, err
	}
	switch {
	case r.node == nil:
		return nil, errf(syscall.ENOENT, "confinement %s does not exist", root)
	case !r.node.isDir():
		return nil, errf(syscall.ENOTDIR, "confinement %s is not a directory", root)
	}
	return &confinement{root: r.node.ino, owner: owner}, nil
}

// inside reports whether the running request may name n by number.
func (s *state) inside(n *inode) bool {
	if s.conf == nil {
		return true
	}
	if n.isDir() {
		return s.within(n, s.conf.root)
	}
	if n.parent == 0 {
		return s.heldOpen(n.ino)
	}
	in := false
	s.namedIn(n, func(dir uint64) bool {
		d := s.inode(dir)
		in = d != nil && s.within(d, s.conf.root)
		return !in
	})
	return in
}

// heldOpen reports whether a session of the confined client holds ino
// open: a file unlinked while it had it open. Only such files (nlink 0,
// still open somewhere) cost this walk of the handles.
func (s *state) heldOpen(ino uint64) bool {
	found := false
	s.handles.root().Walk(func(_ []byte, h *handle) bool {
		found = h.ino == ino && s.ownedBy(h.session)
		return found
	})
	return found
}

// ownedBy reports whether session id belongs to the confined client.
func (s *state) ownedBy(id uint64) bool {
	x := s.session(id)
	return x != nil && s.conf != nil && x.owner == s.conf.owner
}

// errOutside refuses an inode outside the confinement.
func errOutside(ino uint64) error {
	return errf(syscall.EACCES, "inode %d is outside the directory this client is confined to", ino)
}

// checkInside refuses n unless the running request may name it.
func (s *state) checkInside(n *inode) error {
	if !s.inside(n) {
		return errOutside(n.ino)
	}
	return nil
}

// confinedExec runs c under its root: inode numbers swapped in the
// command (and back once it ran, so that a command applied again after a
// recall is the one in the log) and in the result.
func (t *tx) confinedExec(c *pb.Command, sess *session) (*pb.Result, error) {
	conf, err := t.confineTo(c.Root, c.Owner)
	if err != nil {
		return nil, err
	}
	t.conf = conf
	defer func() { t.conf = nil }()
	SwapInodes(c, conf.root)
	r, err := t.exec(c, sess)
	SwapInodes(c, conf.root)
	if r != nil {
		SwapInodes(r, conf.root)
	}
	return r, err
}

// confined returns a private copy of s confined as q asks, with q's inode
// numbers swapped (the caller swaps them back with the root returned).
func (s *state) confined(q *pb.Query) (*state, uint64, error) {
	conf, err := s.confineTo(q.Root, q.Owner)
	if err != nil {
		return nil, 0, err
	}
	v := *s
	v.conf = conf
	for _, id := range []uint64{q.GetLock().GetSession(), q.GetHandle().GetSession()} {
		if id != 0 && !v.ownedBy(id) {
			return nil, 0, errf(syscall.EACCES, "session %d belongs to another client", id)
		}
	}
	SwapInodes(q, conf.root)
	return &v, conf.root, nil
}

// confinedQuery answers q, which carries a root.
func (s *state) confinedQuery(q *pb.Query) *pb.Result {
	v, root, err := s.confined(q)
	if err != nil {
		return errResult(err)
	}
	r := v.query(q)
	SwapInodes(q, root)
	SwapInodes(r, root)
	return r
}

// checkHandle refuses, in a confined query, a handle of another client.
func (s *state) checkHandle(h *handle) error {
	if s.conf != nil && !s.ownedBy(h.session) {
		return errf(syscall.EBADF, "handle %d belongs to another client", h.id)
	}
	return nil
}

// The fields of the protocol that carry inode numbers, by full name. A
// confined client's requests and results have 1 and its root's number
// swapped in these. TestInodeFieldsNamed fails when a message gains a
// 64-bit field that is in neither this table nor notInodeFields, so that a
// new inode field cannot leak real numbers.
var inodeFields = map[protoreflect.FullName]bool{
	"memfs.v1.Attr.ino":          true,
	"memfs.v1.Loc.parent":        true,
	"memfs.v1.Loc.ino":           true,
	"memfs.v1.Dirent.ino":        true,
	"memfs.v1.OpenCmd.ino":       true,
	"memfs.v1.MkdirCmd.ino":      true,
	"memfs.v1.MknodCmd.ino":      true,
	"memfs.v1.SymlinkCmd.ino":    true,
	"memfs.v1.GrantCmd.inos":     true,
	"memfs.v1.CapRef.ino":        true,
	"memfs.v1.TouchCmd.inos":     true,
	"memfs.v1.LockCmd.ino":       true,
	"memfs.v1.LockQuery.ino":     true,
	"memfs.v1.Result.refused":    true,
	"memfs.v1.Result.granted":    true,
	"memfs.v1.Result.first_ino":  true,
	"memfs.v1.WatchEvent.inodes": true,
	"memfs.v1.Recall.ino":        true,
	"memfs.v1.LeechCmd.ino":      true,
	"memfs.v1.HandoffCmd.ino":    true,
	"memfs.v1.RegionQuery.ino":   true,
	"memfs.v1.RegionState.ino":   true,
}

// SwapInodes exchanges inode numbers 1 and root wherever m (a command,
// query, result or watch event, and every message in it) carries an inode
// number. Swapping twice gives m back.
func SwapInodes(m proto.Message, root uint64) {
	if m == nil || root == rootIno {
		return
	}
	swapIn(m.ProtoReflect(), root)
}

func swapIno(v, root uint64) uint64 {
	switch v {
	case rootIno:
		return root
	case root:
		return rootIno
	}
	return v
}

func swapIn(m protoreflect.Message, root uint64) {
	eachField(m, inodeFields, func(v uint64) (uint64, bool) { return swapIno(v, root), true })
}

// eachField calls fn with the value of every field of m, and of the
// messages in it, named in fields, and sets the field to what fn returns
// when that differs; it stops, reporting false, once fn reports false.
func eachField(m protoreflect.Message, fields map[protoreflect.FullName]bool, fn func(uint64) (uint64, bool)) bool {
	ok := true
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.Kind() == protoreflect.MessageKind && fd.IsList():
			l := v.List()
			for i := 0; ok && i < l.Len(); i++ {
				ok = eachField(l.Get(i).Message(), fields, fn)
			}
		case fd.Kind() == protoreflect.MessageKind && !fd.IsMap():
			ok = eachField(v.Message(), fields, fn)
		case !fields[fd.FullName()]:
		case fd.IsList():
			l := v.List()
			for i := 0; ok && i < l.Len(); i++ {
				var w uint64
				if w, ok = fn(l.Get(i).Uint()); w != l.Get(i).Uint() {
					l.Set(i, protoreflect.ValueOfUint64(w))
				}
			}
		default:
			var w uint64
			if w, ok = fn(v.Uint()); w != v.Uint() {
				m.Set(fd, protoreflect.ValueOfUint64(w))
			}
		}
		return ok
	})
	return ok
}

// namedFields are the inode fields of a request that name an existing
// inode for the request to act on (not a number to create, nor a
// capability of the client's own to give back): what Outside checks.
var namedFields = map[protoreflect.FullName]bool{
	"memfs.v1.Loc.parent":      true,
	"memfs.v1.Loc.ino":         true,
	"memfs.v1.GrantCmd.inos":   true,
	"memfs.v1.LockCmd.ino":     true,
	"memfs.v1.LockQuery.ino":   true,
	"memfs.v1.LeechCmd.ino":    true,
	"memfs.v1.HandoffCmd.ino":  true,
	"memfs.v1.RegionQuery.ino": true,
}

// Outside returns an error naming the first inode that request m (a
// command or query of a client confined to root, in the client's
// numbering) names by number and that lies outside root in the current
// state; nil if none does. A node asks before it sends the request on,
// so that a guessed inode number is refused before any work; the state
// machine checks again when the request runs, which is what counts.
func (f *FSM) Outside(root, owner string, m proto.Message) error {
	s := f.cur.Load()
	conf, err := s.confineTo(root, owner)
	if err != nil {
		return nil // the request gets the state machine's answer
	}
	v := *s
	v.conf = conf
	var bad error
	eachNamed(m.ProtoReflect(), func(ino uint64) bool {
		if n := v.inode(swapIno(ino, conf.root)); n != nil && !v.inside(n) {
			bad = errOutside(ino)
		}
		return bad == nil
	})
	return bad
}

func eachNamed(m protoreflect.Message, fn func(uint64) bool) bool {
	return eachField(m, namedFields, func(v uint64) (uint64, bool) { return v, fn(v) })
}

// Confined returns what a client confined to root may see of ev, in its
// numbering: the inodes inside root, the entries of directories inside
// it, and the recalls of inodes inside it or of the client's own
// sessions; nil when nothing is left. It judges by the current state,
// which may be a little ahead of ev: an inode freed since is left out
// (the entry that named it is not, its directory being inside).
func (f *FSM) Confined(ev *pb.WatchEvent, root, owner string) *pb.WatchEvent {
	s := f.cur.Load()
	conf, err := s.confineTo(root, owner)
	if err != nil {
		return nil
	}
	v := *s
	v.conf = conf
	in := func(ino uint64) bool {
		n := v.inode(ino)
		return n != nil && v.inside(n)
	}
	out := &pb.WatchEvent{Index: ev.Index}
	for _, ino := range ev.Inodes {
		if in(ino) {
			out.Inodes = append(out.Inodes, ino)
		}
	}
	for _, e := range ev.Entries {
		if in(e.Ino) {
			out.Entries = append(out.Entries, proto.Clone(e).(*pb.Dirent))
		}
	}
	for _, r := range ev.Recalls {
		if v.ownedBy(r.Session) || in(r.Ino) {
			out.Recalls = append(out.Recalls, proto.Clone(r).(*pb.Recall))
		}
	}
	if len(out.Inodes)+len(out.Entries)+len(out.Recalls) == 0 {
		return nil
	}
	SwapInodes(out, conf.root)
	return out
}
