// Package posixtest is a POSIX behaviour suite that runs the same
// operations in two directories, a FUSE mount and a reference file system
// (tmpfs), and compares what every system call returned: results and
// errnos.
//
// A case is a function over a Rec, which performs each system call under
// its directory and appends one normalised line ("stat a: reg 0644 size=3
// nlink=1") to a transcript. Compare runs every case on both sides, each
// under a time limit so that a hung mount fails the test instead of hanging
// it, and reports the first lines that differ.
//
// It must never import the code under test: it only sees paths.
package posixtest

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// Rec runs system calls under Dir and records their outcomes.
type Rec struct {
	Dir   string
	lines []string
	fds   map[string]int
}

// NewRec returns a recorder working under dir.
func NewRec(dir string) *Rec { return &Rec{Dir: dir, fds: map[string]int{}} }

// Lines is the transcript so far.
func (r *Rec) Lines() []string { return r.lines }

func (r *Rec) p(name string) string { return filepath.Join(r.Dir, name) }

// Note records a line computed by the case itself.
func (r *Rec) Note(format string, args ...any) {
	r.lines = append(r.lines, fmt.Sprintf(format, args...))
}

// rec records "op: ok" / "op: result" / "op: ENAME".
func (r *Rec) rec(op string, res string, err error) {
	switch {
	case err != nil:
		r.lines = append(r.lines, op+": "+errName(err))
	case res == "":
		r.lines = append(r.lines, op+": ok")
	default:
		r.lines = append(r.lines, op+": "+res)
	}
}

// errName renders an error by its errno name so that messages and paths
// (which differ between the two sides) do not.
func errName(err error) string {
	var e syscall.Errno
	if errors.As(err, &e) {
		return errnoName(e)
	}
	return "error(" + err.Error() + ")"
}

func errnoName(e syscall.Errno) string {
	names := map[syscall.Errno]string{
		syscall.ENOENT: "ENOENT", syscall.EEXIST: "EEXIST", syscall.ENOTDIR: "ENOTDIR",
		syscall.EISDIR: "EISDIR", syscall.ENOTEMPTY: "ENOTEMPTY", syscall.EBADF: "EBADF",
		syscall.EINVAL: "EINVAL", syscall.ENAMETOOLONG: "ENAMETOOLONG", syscall.ENOSPC: "ENOSPC",
		syscall.EPERM: "EPERM", syscall.EACCES: "EACCES", syscall.ENODATA: "ENODATA",
		syscall.ERANGE: "ERANGE", syscall.EXDEV: "EXDEV", syscall.ELOOP: "ELOOP",
		syscall.EIO: "EIO", syscall.EBUSY: "EBUSY", syscall.ENOTSUP: "ENOTSUP",
		syscall.EMLINK: "EMLINK", syscall.EFBIG: "EFBIG", syscall.ESPIPE: "ESPIPE",
		syscall.EAGAIN: "EAGAIN", syscall.ENOSYS: "ENOSYS", syscall.EROFS: "EROFS",
		syscall.ENXIO: "ENXIO",
	}
	if n, ok := names[e]; ok {
		return n
	}
	return fmt.Sprintf("errno(%d)", int(e))
}

// fmtStat normalises what a stat reports: the file type, the permission
// bits, and (not for directories, whose size is file system specific) the
// size; link count and owner.
func fmtStat(st *syscall.Stat_t) string {
	typ := map[uint32]string{
		syscall.S_IFREG: "reg", syscall.S_IFDIR: "dir", syscall.S_IFLNK: "lnk",
		syscall.S_IFIFO: "fifo", syscall.S_IFSOCK: "sock",
		syscall.S_IFCHR: "chr", syscall.S_IFBLK: "blk",
	}[st.Mode&syscall.S_IFMT]
	s := fmt.Sprintf("%s %04o", typ, st.Mode&0o7777)
	if typ == "chr" || typ == "blk" {
		s += fmt.Sprintf(" rdev=%#x", st.Rdev)
	}
	if typ != "dir" {
		s += fmt.Sprintf(" size=%d", st.Size)
	}
	return s + fmt.Sprintf(" nlink=%d uid=%d gid=%d", st.Nlink, st.Uid, st.Gid)
}

// Mknod records mknod(2) of name.
func (r *Rec) Mknod(name string, mode uint32, dev int) {
	r.rec(fmt.Sprintf("mknod %s %#o %#x", name, mode, dev), "", syscall.Mknod(r.p(name), mode, dev))
}

// Stat records stat(2) of name.
func (r *Rec) Stat(name string) {
	var st syscall.Stat_t
	err := syscall.Stat(r.p(name), &st)
	r.rec("stat "+name, iff(err == nil, func() string { return fmtStat(&st) }), err)
}

// Lstat records lstat(2) of name.
func (r *Rec) Lstat(name string) {
	var st syscall.Stat_t
	err := syscall.Lstat(r.p(name), &st)
	r.rec("lstat "+name, iff(err == nil, func() string { return fmtStat(&st) }), err)
}

// Fstat records fstat(2) of the descriptor opened as fd.
func (r *Rec) Fstat(fd string) {
	var st syscall.Stat_t
	err := syscall.Fstat(r.fd(fd), &st)
	r.rec("fstat "+fd, iff(err == nil, func() string { return fmtStat(&st) }), err)
}

// StatTimes records the atime and mtime of name to the nanosecond.
func (r *Rec) StatTimes(name string) {
	var st syscall.Stat_t
	err := syscall.Stat(r.p(name), &st)
	r.rec("times "+name, iff(err == nil, func() string {
		return fmt.Sprintf("atime=%d.%09d mtime=%d.%09d", st.Atim.Sec, st.Atim.Nsec, st.Mtim.Sec, st.Mtim.Nsec)
	}), err)
}

// Sparse records whether name occupies fewer blocks than its size needs.
func (r *Rec) Sparse(name string) {
	var st syscall.Stat_t
	err := syscall.Stat(r.p(name), &st)
	r.rec("sparse "+name, iff(err == nil, func() string {
		return fmt.Sprint(st.Blocks*512 < st.Size)
	}), err)
}

func iff(ok bool, f func() string) string {
	if ok {
		return f()
	}
	return ""
}

// Open records open(2) of name and keeps the descriptor as fd.
func (r *Rec) Open(fd, name string, flags int, perm uint32) {
	n, err := syscall.Open(r.p(name), flags|syscall.O_CLOEXEC, perm)
	if err == nil {
		r.fds[fd] = n
	}
	r.rec(fmt.Sprintf("open %s %s", name, flagNames(flags)), "", err)
}

func flagNames(flags int) string {
	var out []string
	switch flags & syscall.O_ACCMODE {
	case syscall.O_RDONLY:
		out = append(out, "RDONLY")
	case syscall.O_WRONLY:
		out = append(out, "WRONLY")
	case syscall.O_RDWR:
		out = append(out, "RDWR")
	}
	for _, f := range []struct {
		bit  int
		name string
	}{{syscall.O_CREAT, "CREAT"}, {syscall.O_EXCL, "EXCL"}, {syscall.O_TRUNC, "TRUNC"},
		{syscall.O_APPEND, "APPEND"}, {syscall.O_DIRECTORY, "DIRECTORY"}, {syscall.O_NOFOLLOW, "NOFOLLOW"}} {
		if flags&f.bit != 0 {
			out = append(out, f.name)
		}
	}
	return strings.Join(out, "|")
}

func (r *Rec) fd(name string) int {
	if n, ok := r.fds[name]; ok {
		return n
	}
	return -1
}

// Close records close(2) of fd.
func (r *Rec) Close(fd string) {
	err := syscall.Close(r.fd(fd))
	delete(r.fds, fd)
	r.rec("close "+fd, "", err)
}

// CloseAll closes descriptors a case left open (after a failure).
func (r *Rec) CloseAll() {
	for k, n := range r.fds {
		_ = syscall.Close(n)
		delete(r.fds, k)
	}
}

// Write records write(2) of data to fd.
func (r *Rec) Write(fd string, data []byte) {
	n, err := syscall.Write(r.fd(fd), data)
	r.rec(fmt.Sprintf("write %s %d", fd, len(data)), fmt.Sprintf("n=%d", n), err)
}

// Pwrite records pwrite(2).
func (r *Rec) Pwrite(fd string, data []byte, off int64) {
	n, err := syscall.Pwrite(r.fd(fd), data, off)
	r.rec(fmt.Sprintf("pwrite %s %d@%d", fd, len(data), off), fmt.Sprintf("n=%d", n), err)
}

// Pread records pread(2) of n bytes: the count and a digest of the data.
func (r *Rec) Pread(fd string, n int, off int64) {
	buf := make([]byte, n)
	got, err := syscall.Pread(r.fd(fd), buf, off)
	r.rec(fmt.Sprintf("pread %s %d@%d", fd, n, off), iff(err == nil, func() string { return digest(buf[:got]) }), err)
}

// Read records read(2) of n bytes at the descriptor's position.
func (r *Rec) Read(fd string, n int) {
	buf := make([]byte, n)
	got, err := syscall.Read(r.fd(fd), buf)
	r.rec(fmt.Sprintf("read %s %d", fd, n), iff(err == nil, func() string { return digest(buf[:got]) }), err)
}

// Seek records lseek(2).
func (r *Rec) Seek(fd string, off int64, whence int) {
	pos, err := syscall.Seek(r.fd(fd), off, whence)
	r.rec(fmt.Sprintf("lseek %s %d %d", fd, off, whence), fmt.Sprintf("pos=%d", pos), err)
}

// Ftruncate records ftruncate(2).
func (r *Rec) Ftruncate(fd string, size int64) {
	r.rec(fmt.Sprintf("ftruncate %s %d", fd, size), "", syscall.Ftruncate(r.fd(fd), size))
}

// Fsync records fsync(2).
func (r *Rec) Fsync(fd string) { r.rec("fsync "+fd, "", syscall.Fsync(r.fd(fd))) }

// digest renders data as its length and a short hash; short data is shown
// as is so that a difference is readable.
func digest(b []byte) string {
	if len(b) <= 32 {
		return fmt.Sprintf("%d %q", len(b), b)
	}
	h := sha256.Sum256(b)
	return fmt.Sprintf("%d sha256:%s", len(b), hex.EncodeToString(h[:8]))
}

// short keeps long names readable in a transcript.
func short(s string) string {
	if len(s) <= 64 {
		return s
	}
	return digest([]byte(s))
}

// ReadFile records the whole content of name.
func (r *Rec) ReadFile(name string) {
	b, err := os.ReadFile(r.p(name))
	r.rec("readfile "+name, iff(err == nil, func() string { return digest(b) }), err)
}

// WriteFile creates or truncates name with data and mode perm.
func (r *Rec) WriteFile(name string, data []byte, perm os.FileMode) {
	r.rec(fmt.Sprintf("writefile %s %d", name, len(data)), "", os.WriteFile(r.p(name), data, perm))
}

// Mkdir records mkdir(2).
func (r *Rec) Mkdir(name string, perm uint32) {
	r.rec(fmt.Sprintf("mkdir %s %04o", name, perm), "", syscall.Mkdir(r.p(name), perm))
}

// Rmdir records rmdir(2).
func (r *Rec) Rmdir(name string) { r.rec("rmdir "+name, "", syscall.Rmdir(r.p(name))) }

// Unlink records unlink(2).
func (r *Rec) Unlink(name string) { r.rec("unlink "+name, "", syscall.Unlink(r.p(name))) }

// Rename records rename(2).
func (r *Rec) Rename(from, to string) {
	r.rec("rename "+from+" "+to, "", syscall.Rename(r.p(from), r.p(to)))
}

// Link records link(2).
func (r *Rec) Link(from, to string) {
	r.rec("link "+from+" "+to, "", syscall.Link(r.p(from), r.p(to)))
}

// Symlink records symlink(2) of a link name pointing at target (stored
// as given).
func (r *Rec) Symlink(target, name string) {
	r.rec("symlink "+short(target)+" "+name, "", syscall.Symlink(target, r.p(name)))
}

// Readlink records readlink(2).
func (r *Rec) Readlink(name string) {
	buf := make([]byte, 4096)
	n, err := syscall.Readlink(r.p(name), buf)
	r.rec("readlink "+name, iff(err == nil, func() string { return short(string(buf[:n])) }), err)
}

// Chmod records chmod(2).
func (r *Rec) Chmod(name string, mode uint32) {
	r.rec(fmt.Sprintf("chmod %s %04o", name, mode), "", syscall.Chmod(r.p(name), mode))
}

// Chown records lchown(2).
func (r *Rec) Chown(name string, uid, gid int) {
	r.rec(fmt.Sprintf("chown %s %d:%d", name, uid, gid), "", syscall.Lchown(r.p(name), uid, gid))
}

// Truncate records truncate(2).
func (r *Rec) Truncate(name string, size int64) {
	r.rec(fmt.Sprintf("truncate %s %d", name, size), "", syscall.Truncate(r.p(name), size))
}

// Utimes records utimensat(2) with explicit times in nanoseconds.
func (r *Rec) Utimes(name string, atimeNs, mtimeNs int64) {
	ts := []syscall.Timespec{syscall.NsecToTimespec(atimeNs), syscall.NsecToTimespec(mtimeNs)}
	r.rec(fmt.Sprintf("utimes %s %d %d", name, atimeNs, mtimeNs), "", syscall.UtimesNano(r.p(name), ts))
}

// Access records access(2).
func (r *Rec) Access(name string, mode uint32) {
	r.rec(fmt.Sprintf("access %s %o", name, mode), "", syscall.Access(r.p(name), mode))
}

// ReadDir records the sorted names in a directory (without . and ..) with
// their types as readdir reports them.
func (r *Rec) ReadDir(name string) {
	ents, err := os.ReadDir(r.p(name))
	r.rec("readdir "+name, iff(err == nil, func() string {
		var out []string
		for _, e := range ents {
			t := "f"
			switch {
			case e.IsDir():
				t = "d"
			case e.Type()&os.ModeSymlink != 0:
				t = "l"
			}
			out = append(out, e.Name()+"/"+t)
		}
		sort.Strings(out)
		return fmt.Sprintf("%d [%s]", len(out), strings.Join(out, " "))
	}), err)
}

// Setxattr records setxattr(2).
func (r *Rec) Setxattr(name, attr string, value []byte, flags int) {
	r.rec(fmt.Sprintf("setxattr %s %s %q %d", name, attr, value, flags), "", syscall.Setxattr(r.p(name), attr, value, flags))
}

// Getxattr records getxattr(2) with a buffer of size bytes (0 asks for
// the length).
func (r *Rec) Getxattr(name, attr string, size int) {
	buf := make([]byte, size)
	n, err := syscall.Getxattr(r.p(name), attr, buf)
	r.rec(fmt.Sprintf("getxattr %s %s %d", name, attr, size), iff(err == nil, func() string {
		if size == 0 {
			return fmt.Sprintf("len=%d", n)
		}
		return fmt.Sprintf("%q", buf[:n])
	}), err)
}

// Listxattr records the sorted user.* names listxattr(2) returns (other
// namespaces, such as security.*, depend on the file system).
func (r *Rec) Listxattr(name string) {
	buf := make([]byte, 4096)
	n, err := syscall.Listxattr(r.p(name), buf)
	r.rec("listxattr "+name, iff(err == nil, func() string {
		var names []string
		for _, s := range strings.Split(string(buf[:n]), "\x00") {
			if strings.HasPrefix(s, "user.") {
				names = append(names, s)
			}
		}
		sort.Strings(names)
		return "[" + strings.Join(names, " ") + "]"
	}), err)
}

// Removexattr records removexattr(2).
func (r *Rec) Removexattr(name, attr string) {
	r.rec(fmt.Sprintf("removexattr %s %s", name, attr), "", syscall.Removexattr(r.p(name), attr))
}

// DotEntries records whether the raw listing of directory name (getdents64,
// which os.ReadDir filters) has "." naming the directory itself and ".."
// naming its parent.
func (r *Rec) DotEntries(name string) {
	res, err := func() (string, error) {
		var self, parent syscall.Stat_t
		if err := syscall.Stat(r.p(name), &self); err != nil {
			return "", err
		}
		if err := syscall.Stat(filepath.Dir(r.p(name)), &parent); err != nil {
			return "", err
		}
		fd, err := syscall.Open(r.p(name), syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return "", err
		}
		defer syscall.Close(fd)
		inos := map[string]uint64{}
		buf := make([]byte, 64<<10)
		for {
			n, err := syscall.Getdents(fd, buf)
			if err != nil {
				return "", err
			}
			if n == 0 {
				break
			}
			for off := 0; off < n; {
				// struct linux_dirent64: ino u64, off s64, reclen u16,
				// type u8, name NUL-terminated.
				b := buf[off:n]
				reclen := int(b[16]) | int(b[17])<<8
				nm := b[19:reclen]
				if i := strings.IndexByte(string(nm), 0); i >= 0 {
					nm = nm[:i]
				}
				inos[string(nm)] = uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
					uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
				off += reclen
			}
		}
		dot, okDot := inos["."]
		dotdot, okDotDot := inos[".."]
		return fmt.Sprintf(". listed=%v self=%v, .. listed=%v parent=%v",
			okDot, dot == self.Ino, okDotDot, dotdot == parent.Ino), nil
	}()
	r.rec("dot entries "+name, res, err)
}

// Flock records flock(2) on fd; how is LOCK_SH, LOCK_EX or LOCK_UN,
// with LOCK_NB.
func (r *Rec) Flock(fd string, how int) {
	name := map[int]string{syscall.LOCK_SH: "SH", syscall.LOCK_EX: "EX", syscall.LOCK_UN: "UN"}[how&^syscall.LOCK_NB]
	if how&syscall.LOCK_NB != 0 {
		name += "|NB"
	}
	r.rec(fmt.Sprintf("flock %s %s", fd, name), "", syscall.Flock(r.fd(fd), how))
}

// Fcntl lock commands (Linux values; the open file description ones are
// not in package syscall).
const (
	OFDGetLk = 36 // F_OFD_GETLK
	OFDSetLk = 37 // F_OFD_SETLK
)

func lockCmdName(cmd int) string {
	return map[int]string{
		syscall.F_GETLK: "GETLK", syscall.F_SETLK: "SETLK", syscall.F_SETLKW: "SETLKW",
		OFDGetLk: "OFD_GETLK", OFDSetLk: "OFD_SETLK",
	}[cmd]
}

func lockTypeName(typ int16) string {
	return map[int16]string{syscall.F_RDLCK: "RD", syscall.F_WRLCK: "WR", syscall.F_UNLCK: "UN"}[typ]
}

// SetLk records fcntl(2) F_SETLK (or another setting cmd) of the bytes
// [start, start+length) (length 0: to the end of any file) on fd.
func (r *Rec) SetLk(fd string, cmd int, typ int16, start, length int64) {
	lk := syscall.Flock_t{Type: typ, Whence: 0, Start: start, Len: length}
	err := syscall.FcntlFlock(uintptr(r.fd(fd)), cmd, &lk)
	r.rec(fmt.Sprintf("fcntl %s %s %s %d+%d", fd, lockCmdName(cmd), lockTypeName(typ), start, length), "", err)
}

// GetLk records what F_GETLK (or F_OFD_GETLK) reports on fd: the first
// lock in the way, and whether this process holds it (its pid, or -1 for
// an open file description's). Which of the two F_OFD_GETLK reports for
// a record lock is the kernel's choice: through FUSE it marks every lock
// it returns as an open file description's.
func (r *Rec) GetLk(fd string, cmd int, typ int16, start, length int64) {
	lk := syscall.Flock_t{Type: typ, Whence: 0, Start: start, Len: length}
	err := syscall.FcntlFlock(uintptr(r.fd(fd)), cmd, &lk)
	res := iff(err == nil, func() string {
		if lk.Type == syscall.F_UNLCK {
			return "free"
		}
		who := "other"
		if lk.Pid == int32(os.Getpid()) || lk.Pid == -1 {
			who = "self"
		}
		return fmt.Sprintf("%s %d+%d by %s", lockTypeName(lk.Type), lk.Start, lk.Len, who)
	})
	r.rec(fmt.Sprintf("fcntl %s %s %s %d+%d", fd, lockCmdName(cmd), lockTypeName(typ), start, length), res, err)
}
