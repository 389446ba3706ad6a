package fsm

import (
	"strings"
	"syscall"

	pb "github.com/memoryfs/memfs/memfspb"
)

// resolved is where a Loc leads: the directory entry (dir, name) and the
// inode it names. node is nil when the entry does not exist; dir is nil
// for the root and for a Loc given by inode number.
type resolved struct {
	dir   *inode
	name  string
	node  *inode
	slash bool // the path ended in '/': the node must be a directory
}

// resolve finds loc. follow makes a symlink in the last component lead to
// its target; intermediate symlinks are always followed. Commands use
// tx.resolve.
func (s *state) resolve(loc *pb.Loc, follow bool) (resolved, error) {
	return s.resolveWith(&walker{s: s}, loc, follow)
}

func (s *state) resolveWith(w *walker, loc *pb.Loc, follow bool) (resolved, error) {
	if loc == nil {
		return resolved{}, errf(syscall.EINVAL, "no location given")
	}
	switch {
	case loc.Path != "":
		p := loc.Path
		if len(p) > maxPathLen {
			return resolved{}, errf(syscall.ENAMETOOLONG, "path of %d bytes", len(p))
		}
		if strings.IndexByte(p, 0) >= 0 {
			return resolved{}, errf(syscall.EINVAL, "path %q contains NUL", p)
		}
		if p[0] != '/' {
			return resolved{}, errf(syscall.EINVAL, "path %q is not absolute", p)
		}
		return w.walk(s.inode(s.rootOf()), p, follow)
	case loc.Name != "":
		if err := checkName(loc.Name); err != nil {
			return resolved{}, err
		}
		dir := s.inode(loc.Parent)
		if dir == nil {
			return resolved{}, errf(syscall.ENOENT, "directory inode %d", loc.Parent)
		}
		if !dir.isDir() {
			return resolved{}, errf(syscall.ENOTDIR, "inode %d", loc.Parent)
		}
		if err := s.checkInside(dir); err != nil {
			return resolved{}, err
		}
		return w.walk(dir, loc.Name, follow)
	case loc.Ino != 0:
		n := s.inode(loc.Ino)
		if n == nil {
			return resolved{}, errf(syscall.ENOENT, "inode %d", loc.Ino)
		}
		if err := s.checkInside(n); err != nil {
			return resolved{}, err
		}
		return resolved{node: n}, nil
	}
	return resolved{}, errf(syscall.EINVAL, "empty location")
}

// checkName validates one path component given on its own.
func checkName(name string) error {
	if len(name) > maxNameLen {
		return errf(syscall.ENAMETOOLONG, "name of %d bytes", len(name))
	}
	if strings.IndexByte(name, '/') >= 0 || strings.IndexByte(name, 0) >= 0 {
		return errf(syscall.EINVAL, "name %q contains '/' or NUL", name)
	}
	return nil
}

// lookup resolves loc to an existing inode, following a final symlink
// unless loc.nofollow. Commands use tx.lookup.
func (s *state) lookup(loc *pb.Loc) (*inode, error) {
	r, err := s.resolve(loc, !loc.GetNofollow())
	if err != nil {
		return nil, err
	}
	return r.existing(loc)
}

func (r resolved) existing(loc *pb.Loc) (*inode, error) {
	if r.node == nil {
		return nil, errf(syscall.ENOENT, "%s", locString(loc))
	}
	if r.slash && !r.node.isDir() {
		return nil, errf(syscall.ENOTDIR, "%s", locString(loc))
	}
	return r.node, nil
}

// newEntry resolves loc as the name of something to create.
func (t *tx) newEntry(loc *pb.Loc, follow bool) (resolved, error) {
	r, err := t.resolve(loc, follow)
	if err != nil {
		return r, err
	}
	return r, r.creatable(loc)
}

// creatable checks that r can be created: the entry must not exist and its
// directory must be live.
func (r resolved) creatable(loc *pb.Loc) error {
	if err := r.nameable(loc); err != nil {
		return err
	}
	if r.node != nil {
		return errf(syscall.EEXIST, "%s", locString(loc))
	}
	if r.dir.nlink == 0 {
		return errf(syscall.ENOENT, "%s: directory was removed", locString(loc))
	}
	return nil
}

// oldEntry resolves loc as an existing directory entry to remove or move;
// a final symlink is the entry itself.
func (t *tx) oldEntry(loc *pb.Loc) (resolved, error) {
	r, err := t.resolve(loc, false)
	if err != nil {
		return r, err
	}
	if r.dir == nil && r.node != nil && r.node.ino == t.rootOf() {
		return r, errf(syscall.EBUSY, "%s is the root", locString(loc))
	}
	if err := r.nameable(loc); err != nil {
		return r, err
	}
	if _, err := r.existing(loc); err != nil {
		return r, err
	}
	return r, nil
}

// nameable checks that r is a real directory entry with a usable name.
func (r resolved) nameable(loc *pb.Loc) error {
	if r.dir == nil {
		if r.node != nil && loc.GetIno() == 0 { // only the root has no entry

			return errf(syscall.EEXIST, "%s is the root", locString(loc))
		}
		return errf(syscall.EINVAL, "%s: needs a path or a parent and name", locString(loc))
	}
	if r.name == "." || r.name == ".." {
		return errf(syscall.EINVAL, "%s: %q as a name", locString(loc), r.name)
	}
	return nil
}

func locString(loc *pb.Loc) string {
	switch {
	case loc == nil:
		return "<nil>"
	case loc.Path != "":
		return loc.Path
	case loc.Name != "":
		return "inode " + utoa(loc.Parent) + "/" + loc.Name
	}
	return "inode " + utoa(loc.Ino)
}

func utoa(n uint64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}

// walker resolves paths, counting symlinks across nested resolutions.
type walker struct {
	s     *state
	links int
	// seen, when set, collects every directory looked in and every
	// symlink followed: what the resolution read.
	seen *[]uint64
}

// walk resolves p from start (from the root when p is absolute).
func (w *walker) walk(start *inode, p string, follow bool) (resolved, error) {
	cur := start
	if strings.HasPrefix(p, "/") {
		cur = w.s.inode(w.s.rootOf())
	}
	rest := p
	for {
		rest = strings.TrimLeft(rest, "/")
		if rest == "" {
			// "/" alone (or a symlink to it): the directory itself.
			return resolved{node: cur}, nil
		}
		comp := rest
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			comp, rest = rest[:i], rest[i:]
		} else {
			rest = ""
		}
		last := strings.TrimLeft(rest, "/") == ""
		slash := last && rest != ""
		if len(comp) > maxNameLen {
			return resolved{}, errf(syscall.ENAMETOOLONG, "component of %d bytes in %q", len(comp), p)
		}
		if !cur.isDir() {
			return resolved{}, errf(syscall.ENOTDIR, "%q: inode %d is not a directory", p, cur.ino)
		}
		next, err := w.step(cur, comp)
		if err != nil {
			return resolved{}, err
		}
		if next == nil {
			if last {
				return resolved{dir: cur, name: comp, slash: slash}, nil
			}
			return resolved{}, errf(syscall.ENOENT, "%q: no %q", p, comp)
		}
		if next.isLnk() && (!last || follow || slash) {
			r, err := w.follow(cur, next)
			if err != nil {
				return resolved{}, err
			}
			if last {
				r.slash = r.slash || slash
				return r, nil
			}
			if r.node == nil {
				return resolved{}, errf(syscall.ENOENT, "%q: dangling symlink %q", p, comp)
			}
			next = r.node
		}
		if last {
			return resolved{dir: cur, name: comp, node: next, slash: slash}, nil
		}
		cur = next
	}
}

// step looks up one component in directory dir; nil when absent.
func (w *walker) step(dir *inode, comp string) (*inode, error) {
	if w.seen != nil {
		*w.seen = append(*w.seen, dir.ino)
	}
	switch comp {
	case ".":
		return dir, nil
	case "..":
		if dir.ino == rootIno || dir.ino == w.s.rootOf() {
			return dir, nil // a confined client's root is its "/"
		}
		p := w.s.inode(dir.parent)
		if p == nil {
			return nil, errf(syscall.ENOENT, "parent of inode %d", dir.ino)
		}
		return p, nil
	}
	d, ok := w.s.dirent(dir.ino, comp)
	if !ok {
		return nil, nil
	}
	n := w.s.inode(d.ino)
	if n == nil {
		return nil, errf(syscall.EIO, "entry %q names missing inode %d", comp, d.ino)
	}
	return n, nil
}

// follow resolves symlink link found in directory dir.
func (w *walker) follow(dir, link *inode) (resolved, error) {
	w.links++
	if w.seen != nil {
		*w.seen = append(*w.seen, link.ino)
	}
	if w.links > maxSymlinks {
		return resolved{}, errf(syscall.ELOOP, "more than %d symlinks", maxSymlinks)
	}
	t := link.target()
	if t == "" {
		return resolved{}, errf(syscall.ENOENT, "empty symlink %d", link.ino)
	}
	return w.walk(dir, t, true)
}
