package posixtest

import (
	"encoding/binary"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// Case is one scenario. It runs in an empty directory (r.Dir) and records
// every outcome through r.
type Case func(r *Rec)

const (
	rdonly = syscall.O_RDONLY
	wronly = syscall.O_WRONLY
	rdwr   = syscall.O_RDWR
	creat  = syscall.O_CREAT
	excl   = syscall.O_EXCL
	trunc  = syscall.O_TRUNC
	appnd  = syscall.O_APPEND
)

// Data returns n deterministic pseudo-random bytes for seed, so that both
// sides of a comparison write the same content.
func Data(seed uint64, n int) []byte {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := rng.Uint64()
		for j := 0; j < 8; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// Cases is the suite, by name.
var Cases = map[string]Case{
	"files":           files,
	"dirs":            dirs,
	"renames":         renames,
	"hardlinks":       hardlinks,
	"symlinks":        symlinks,
	"modes":           modes,
	"truncate":        truncate,
	"sparse":          sparse,
	"append":          appendCase,
	"excl":            exclCase,
	"unlink_open":     unlinkOpen,
	"large":           large,
	"xattrs":          xattrs,
	"times":           times,
	"big_dir":         bigDir,
	"names":           names,
	"rename_open":     renameOpen,
	"overwrite_tails": overwriteTails,
	"setgid_dir":      setgidDir,
	"rename_over":     renameOver,
	"special_files":   specialFiles,
	"rewinddir":       rewinddirCase,
	"seekdir":         seekdirCase,
	"locks":           locks,
	"seek_data_hole":  seekDataHole,
	"seek_huge":       seekHuge,
}

func files(r *Rec) {
	r.Open("a", "f", wronly|creat, 0o644)
	r.Write("a", []byte("hello"))
	r.Pwrite("a", []byte("J"), 0)
	r.Close("a")
	r.Stat("f")
	r.ReadFile("f")
	r.Open("b", "f", rdonly, 0)
	r.Pread("b", 100, 0)
	r.Pread("b", 3, 2)
	r.Pread("b", 10, 5)
	r.Pread("b", 10, 1000)
	r.Write("b", []byte("x"))
	r.Close("b")
	r.Open("c", "missing", rdonly, 0)
	r.Open("c", "f", wronly|trunc, 0)
	r.Close("c")
	r.Stat("f")
	r.Open("d", "f/x", rdonly, 0)
	r.Open("d", "f", rdonly|syscall.O_DIRECTORY, 0)
	r.Open("e", "f", rdwr, 0)
	r.Write("e", []byte("abcdef"))
	r.Seek("e", 2, 0)
	r.Read("e", 2)
	r.Seek("e", 0, 2)
	r.Close("e")
	r.Access("f", 4)
	r.Access("missing", 4)
}

func dirs(r *Rec) {
	r.Mkdir("d", 0o755)
	r.Mkdir("d", 0o755)
	r.Mkdir("d/e", 0o700)
	r.Mkdir("missing/e", 0o755)
	r.WriteFile("d/f", []byte("x"), 0o644)
	r.Mkdir("d/f/g", 0o755)
	r.Stat("d")
	r.Stat("d/e")
	r.ReadDir("d")
	r.DotEntries("d")
	r.DotEntries("d/e")
	r.Rmdir("d")
	r.Rmdir("d/f")
	r.Unlink("d/e")
	r.Rmdir("d/e")
	r.Open("x", "d", wronly, 0)
	r.Open("y", "d", rdonly, 0)
	r.Read("y", 10)
	r.Close("y")
	r.Unlink("d/f")
	r.Rmdir("d")
	r.Stat("d")
	r.ReadDir("")
	r.Rmdir("missing")
}

func renames(r *Rec) {
	r.WriteFile("a", []byte("A"), 0o644)
	r.WriteFile("b", []byte("BB"), 0o644)
	r.Rename("a", "c")
	r.Stat("a")
	r.ReadFile("c")
	r.Rename("c", "b") // replaces b
	r.ReadFile("b")
	r.Stat("c")
	r.Rename("b", "b")
	r.Mkdir("d1", 0o755)
	r.Mkdir("d2", 0o755)
	r.Mkdir("d3", 0o755)
	r.WriteFile("d3/x", nil, 0o644)
	r.Rename("d1", "d2") // onto an empty directory
	r.Stat("d1")
	r.Rename("d2", "d3") // onto a non-empty one
	r.Rename("b", "d2")  // file onto directory
	r.Rename("d2", "b")  // directory onto file
	r.Rename("d2", "d2/sub")
	r.Mkdir("d2/sub", 0o755)
	r.Rename("d2", "d2/sub/inner")
	r.Rename("missing", "z")
	r.Rename("b", "missing/z")
	r.Rename("b", "d3/y") // across directories
	r.ReadDir("d3")
	r.ReadDir("")
	r.Rename("d2", "d3/d2")
	r.Stat("d3/d2/sub")
	r.Stat("d3")
}

func hardlinks(r *Rec) {
	r.WriteFile("a", []byte("one"), 0o644)
	r.Link("a", "b")
	r.Stat("a")
	r.Stat("b")
	r.Open("w", "b", wronly|appnd, 0)
	r.Write("w", []byte("+two"))
	r.Close("w")
	r.ReadFile("a")
	r.Link("a", "b")
	r.Mkdir("d", 0o755)
	r.Link("d", "e")
	r.Link("missing", "e")
	r.Link("a", "d/c")
	r.Unlink("a")
	r.Stat("b")
	r.Stat("d/c")
	r.Chmod("b", 0o600)
	r.Stat("d/c")
	r.Rename("b", "d/c") // both names of one inode: nothing happens
	r.Stat("b")
	r.Unlink("b")
	r.Stat("d/c")
}

func symlinks(r *Rec) {
	r.WriteFile("f", []byte("target data"), 0o644)
	r.Symlink("f", "l")
	r.Symlink("missing", "dangling")
	r.Symlink("/absolute/path", "abs")
	r.Symlink("f", "l")
	r.Lstat("l")
	r.Stat("l")
	r.Stat("dangling")
	r.Lstat("dangling")
	r.Readlink("l")
	r.Readlink("abs")
	r.Readlink("f")
	r.ReadFile("l")
	r.Open("n", "l", rdonly|syscall.O_NOFOLLOW, 0)
	r.Mkdir("d", 0o755)
	r.Symlink("../f", "d/up")
	r.ReadFile("d/up")
	r.Symlink("d", "dl")
	r.ReadDir("dl")
	r.Stat("dl/up")
	r.Symlink("loop2", "loop1")
	r.Symlink("loop1", "loop2")
	r.Stat("loop1")
	r.Rename("l", "l2")
	r.Readlink("l2")
	r.Unlink("l2")
	r.Stat("f")
	r.Symlink(strings.Repeat("x", 1000), "long")
	r.Readlink("long")
	r.Lstat("long")
	r.ReadDir("")
}

func modes(r *Rec) {
	r.Open("a", "f", wronly|creat, 0o640)
	r.Close("a")
	r.Stat("f")
	r.Chmod("f", 0o755)
	r.Stat("f")
	r.Chmod("f", 0o4755)
	r.Stat("f")
	r.Chmod("f", 0o2700)
	r.Stat("f")
	r.Chmod("f", 0)
	r.Stat("f")
	r.Mkdir("d", 0o700)
	r.Stat("d")
	r.Chmod("d", 0o2775)
	r.Stat("d")
	r.Chown("f", 1234, 5678)
	r.Stat("f")
	r.Chown("f", -1, 42)
	r.Stat("f")
	r.Symlink("f", "l")
	r.Chown("l", 77, 88)
	r.Lstat("l")
	r.Stat("l")
	r.Chmod("missing", 0o644)
}

func truncate(r *Rec) {
	r.WriteFile("f", Data(1, 10000), 0o644)
	r.Truncate("f", 100)
	r.Stat("f")
	r.ReadFile("f")
	r.Truncate("f", 5000)
	r.Stat("f")
	r.ReadFile("f")
	r.Open("a", "f", rdwr, 0)
	r.Ftruncate("a", 10)
	r.Fstat("a")
	r.Pread("a", 100, 0)
	r.Ftruncate("a", 200000)
	r.Pread("a", 50, 199990)
	r.Close("a")
	r.Truncate("f", 0)
	r.Stat("f")
	r.Mkdir("d", 0o755)
	r.Truncate("d", 0)
	r.Truncate("missing", 0)
	r.Truncate("f", -1)
}

func sparse(r *Rec) {
	r.Open("a", "f", rdwr|creat, 0o644)
	r.Pwrite("a", []byte("end"), 10<<20)
	r.Pwrite("a", []byte("start"), 0)
	r.Fstat("a")
	r.Pread("a", 100, 5<<20)
	r.Pread("a", 10, 10<<20-4)
	r.Pread("a", 16, 0)
	r.Close("a")
	r.Sparse("f")
	r.ReadFile("f")
	r.Truncate("f", 20<<20)
	r.Sparse("f")
	r.Stat("f")
}

// lseek(2)'s whence values for data and holes (Linux).
const (
	seekData = 3
	seekHole = 4
)

// seekDataHole: SEEK_DATA and SEEK_HOLE on hole, data, hole, data, hole,
// before and after fsync. Data is written in whole MiBs of non-zero bytes
// (or up to the end of file), so that the answers agree whatever the
// allocation unit (a page of tmpfs, a chunk of the cluster) as long as it
// divides 1 MiB. An offset at or past the end, or negative, is ENXIO.
func seekDataHole(r *Rec) {
	const mb = 1 << 20
	r.Open("a", "f", rdwr|creat, 0o644)
	for _, w := range []int{seekData, seekHole} {
		r.Seek("a", 0, w) // empty file
	}
	r.Pwrite("a", Data(31, mb), mb)
	r.Pwrite("a", Data(32, mb), 3*mb)
	r.Ftruncate("a", 5*mb)
	offsets := []int64{0, 1, mb - 1, mb, mb + 5, 2*mb - 1, 2 * mb, 3*mb + 4096, 4 * mb, 5*mb - 1, 5 * mb, 5*mb + 1, -1}
	for _, sync := range []bool{false, true} {
		if sync {
			r.Fsync("a")
		}
		for _, off := range offsets {
			r.Seek("a", off, seekData)
			r.Seek("a", off, seekHole)
		}
	}
	// Data up to an end of file that is not on a MiB boundary.
	r.Pwrite("a", Data(33, 100), 5*mb)
	for _, off := range []int64{4 * mb, 5 * mb, 5*mb + 99, 5*mb + 100} {
		r.Seek("a", off, seekData)
		r.Seek("a", off, seekHole)
	}
	r.Seek("a", 0, 1) // the position the last lseek left
	r.Ftruncate("a", mb+10)
	r.Seek("a", 0, seekData)
	r.Seek("a", mb, seekHole)
	r.Seek("a", 2*mb, seekData)
	r.Close("a")
	r.Open("b", "f", rdonly, 0)
	r.Seek("b", 2, seekData)
	r.Seek("b", 2, seekHole)
	r.Close("b")
}

// seekHuge: a sparse file with data at the start and just below 1 TiB
// (the cluster's largest file size), found across the hole between, as
// the huge-file checks of xfstests' seek_sanity_test do.
func seekHuge(r *Rec) {
	const mb, end = 1 << 20, 1 << 40
	r.Open("a", "f", rdwr|creat, 0o644)
	r.Pwrite("a", Data(41, mb), 0)
	r.Pwrite("a", Data(42, mb), end-mb)
	r.Fstat("a")
	for _, off := range []int64{0, 1, mb, 8 << 30, end - 2*mb, end - mb, end - mb + 1, end - 1, end, end + 1} {
		r.Seek("a", off, seekData)
		r.Seek("a", off, seekHole)
	}
	r.Pread("a", 16, end-16)
	r.Pread("a", 16, end-mb-8)
	r.Ftruncate("a", 2*mb)
	r.Seek("a", mb, seekData)
	r.Close("a")
}

func appendCase(r *Rec) {
	r.WriteFile("f", []byte("base"), 0o644)
	r.Open("a", "f", wronly|appnd, 0)
	r.Write("a", []byte("-one"))
	r.Seek("a", 0, 0)
	r.Write("a", []byte("-two"))
	r.Pwrite("a", []byte("-three"), 0) // Linux appends despite the offset
	r.Close("a")
	r.ReadFile("f")
	r.Open("b", "f", rdwr|appnd, 0)
	r.Open("c", "f", wronly|appnd, 0)
	r.Write("b", []byte("[b]"))
	r.Write("c", []byte("[c]"))
	r.Write("b", []byte("[b2]"))
	r.Seek("b", 0, 0)
	r.Read("b", 100)
	r.Close("b")
	r.Close("c")
	r.Open("d", "new", wronly|appnd|creat, 0o600)
	r.Write("d", Data(2, 300000))
	r.Write("d", []byte("tail"))
	r.Close("d")
	r.Stat("new")
	r.ReadFile("new")
}

func exclCase(r *Rec) {
	r.Open("a", "f", wronly|creat|excl, 0o600)
	r.Close("a")
	r.Open("b", "f", wronly|creat|excl, 0o600)
	r.Open("b", "f", wronly|creat, 0o600)
	r.Close("b")
	r.Symlink("nowhere", "l")
	r.Open("c", "l", wronly|creat|excl, 0o600)
	r.Stat("nowhere")
	r.Mkdir("d", 0o755)
	r.Open("e", "d", wronly|creat|excl, 0o600)
	r.Open("e", "d", rdonly|creat, 0o600)
	r.Open("e", "missing/f", wronly|creat, 0o600)
	r.ReadDir("")
}

func unlinkOpen(r *Rec) {
	r.WriteFile("f", []byte("still here"), 0o644)
	r.Open("a", "f", rdwr, 0)
	r.Open("b", "f", rdonly, 0)
	r.Unlink("f")
	r.Stat("f")
	r.Pread("a", 100, 0)
	r.Fstat("a")
	r.Pwrite("a", []byte(" and more"), 10)
	r.Pread("b", 100, 0)
	r.Ftruncate("a", 5)
	r.Pread("b", 100, 0)
	r.Close("a")
	r.Pread("b", 100, 0)
	r.Fstat("b")
	r.Close("b")
	r.ReadDir("")
	r.WriteFile("f", []byte("new"), 0o644)
	r.ReadFile("f")
	// Replacing a file by rename while it is open behaves the same way.
	r.Open("c", "f", rdonly, 0)
	r.WriteFile("g", []byte("replacement"), 0o644)
	r.Rename("g", "f")
	r.Pread("c", 100, 0)
	r.ReadFile("f")
	r.Close("c")
}

func large(r *Rec) {
	const size = 24<<20 + 12345
	data := Data(3, size)
	r.Open("a", "big", wronly|creat|trunc, 0o644)
	for off := 0; off < size; {
		n := 1 << 20
		if off%(3<<20) == 0 {
			n = 100003 // odd sizes cross chunk and page boundaries
		}
		if off+n > size {
			n = size - off
		}
		r.Write("a", data[off:off+n])
		off += n
	}
	r.Fsync("a")
	r.Close("a")
	r.Stat("big")
	r.ReadFile("big")
	r.Open("b", "big", rdwr, 0)
	rng := rand.New(rand.NewPCG(4, 4))
	for i := 0; i < 20; i++ {
		off := rng.Int64N(size)
		r.Pread("b", 1+rng.IntN(300000), off)
	}
	r.Pwrite("b", Data(5, 200000), 7<<20+3)
	r.Pread("b", 300000, 7<<20-50000)
	r.Close("b")
	r.ReadFile("big")
}

func xattrs(r *Rec) {
	r.WriteFile("f", nil, 0o644)
	r.Setxattr("f", "user.a", []byte("alpha"), 0)
	r.Setxattr("f", "user.b", []byte(""), 0)
	r.Setxattr("f", "user.a", []byte("again"), 1) // XATTR_CREATE
	r.Setxattr("f", "user.c", []byte("x"), 2)     // XATTR_REPLACE
	r.Setxattr("f", "user.a", []byte("beta"), 2)
	r.Getxattr("f", "user.a", 100)
	r.Getxattr("f", "user.a", 0)
	r.Getxattr("f", "user.a", 2)
	r.Getxattr("f", "user.b", 100)
	r.Getxattr("f", "user.missing", 100)
	r.Listxattr("f")
	r.Removexattr("f", "user.a")
	r.Removexattr("f", "user.a")
	r.Listxattr("f")
	r.Mkdir("d", 0o755)
	r.Setxattr("d", "user.dir", Data(6, 3000), 0)
	r.Getxattr("d", "user.dir", 4000)
	r.Getxattr("missing", "user.a", 10)
}

func times(r *Rec) {
	r.WriteFile("f", []byte("t"), 0o644)
	r.Utimes("f", 1_000_000_000_123456789, 1_200_000_000_987654321)
	r.StatTimes("f")
	r.Mkdir("d", 0o755)
	r.Utimes("d", 42, 43)
	r.StatTimes("d")
	r.Utimes("missing", 1, 2)
}

func bigDir(r *Rec) {
	r.Mkdir("d", 0o755)
	for i := 0; i < 600; i++ {
		r.WriteFile("d/"+strings.Repeat("n", i%40)+itoa(i), nil, 0o644)
	}
	r.ReadDir("d")
	for i := 0; i < 600; i += 3 {
		r.Unlink("d/" + strings.Repeat("n", i%40) + itoa(i))
	}
	r.ReadDir("d")
}

func itoa(i int) string {
	const digits = "0123456789"
	if i < 10 {
		return digits[i : i+1]
	}
	return itoa(i/10) + digits[i%10:i%10+1]
}

func names(r *Rec) {
	r.WriteFile(strings.Repeat("a", 255), []byte("x"), 0o644)
	r.WriteFile(strings.Repeat("b", 256), []byte("x"), 0o644)
	r.Mkdir(strings.Repeat("c", 256), 0o755)
	r.Stat(strings.Repeat("a", 255))
	r.WriteFile("sp ace", []byte("1"), 0o644)
	r.WriteFile("ünï©ødé", []byte("2"), 0o644)
	r.WriteFile("-dash", []byte("3"), 0o644)
	r.WriteFile("new\nline", []byte("4"), 0o644)
	// Too long for any call, also those that look the name up first
	// (where a cached listing must not answer "absent").
	long := strings.Repeat("d", 256)
	r.ReadDir("")
	r.Stat(long)
	r.Chmod(long, 0o600)
	r.Truncate(long, 0)
	r.Unlink(long)
	r.Rmdir(long)
	r.Rename("sp ace", long)
	r.Link("-dash", long)
	r.Rename(long, "x")
}

func renameOpen(r *Rec) {
	r.WriteFile("a", []byte("content of a"), 0o644)
	r.Open("h", "a", rdwr, 0)
	r.Rename("a", "b")
	r.Pwrite("h", []byte("A"), 0)
	r.ReadFile("b")
	r.Fstat("h")
	r.Close("h")
	r.Mkdir("d", 0o755)
	r.Open("dh", "d", rdonly|syscall.O_DIRECTORY, 0)
	r.Rename("d", "e")
	r.Close("dh")
	r.Stat("e")
}

func overwriteTails(r *Rec) {
	r.WriteFile("f", Data(7, 200000), 0o644)
	r.Open("a", "f", rdwr, 0)
	for _, off := range []int64{0, 4095, 4096, 65535, 65536, 131071, 199999, 250000} {
		r.Pwrite("a", []byte("<>"), off)
	}
	r.Fstat("a")
	r.Close("a")
	r.ReadFile("f")
}

// setgidDir: what is made in a set-group-ID directory takes its group,
// and a directory the bit as well, all the way down.
func setgidDir(r *Rec) {
	r.Mkdir("g", 0o755)
	r.Chown("g", -1, 4321)
	r.Chmod("g", 0o2775)
	r.Stat("g")
	r.Mkdir("g/sub", 0o755)
	r.Stat("g/sub")
	r.Mkdir("g/sub/deeper", 0o700)
	r.Stat("g/sub/deeper")
	r.WriteFile("g/f", []byte("x"), 0o644)
	r.Stat("g/f")
	r.Open("h", "g/x", wronly|syscall.O_CREAT|syscall.O_EXCL, 0o2755)
	r.Fstat("h")
	r.Close("h")
	r.Symlink("f", "g/l")
	r.Lstat("g/l")
	// Outside it, the creator's group again.
	r.Mkdir("plain", 0o755)
	r.Stat("plain")
}

// renameOver: a file replaced by a rename stays readable, writable and
// stat-able through the descriptors still open on it, with no link left.
func renameOver(r *Rec) {
	r.WriteFile("old", []byte("the old content"), 0o644)
	r.WriteFile("new", []byte("the new one"), 0o644)
	r.Open("ro", "old", rdonly, 0)
	r.Open("rw", "old", rdwr, 0)
	r.Pread("ro", 4, 0) // a read before, as a program that opened it would
	r.Rename("new", "old")
	r.Fstat("ro")
	r.Fstat("rw")
	r.Pread("ro", 64, 0)
	r.Pwrite("rw", []byte("OLD"), 4)
	r.Pread("ro", 64, 0)
	r.Fstat("ro")
	r.ReadFile("old")
	r.Close("ro")
	r.Close("rw")
	r.Stat("old")
}

// specialFiles: FIFOs, sockets and devices are made, listed, stat'ed,
// linked, renamed and removed like files; a FIFO passes data between two
// descriptors of this host.
func specialFiles(r *Rec) {
	r.Mknod("fifo", syscall.S_IFIFO|0o640, 0)
	r.Mknod("sock", syscall.S_IFSOCK|0o755, 0)
	r.Mknod("chr", syscall.S_IFCHR|0o600, 0x0103)
	r.Mknod("blk", syscall.S_IFBLK|0o660, 0x0800)
	r.Mknod("reg", syscall.S_IFREG|0o644, 0)
	r.Mknod("fifo", syscall.S_IFIFO|0o640, 0)
	for _, n := range []string{"fifo", "sock", "chr", "blk", "reg"} {
		r.Lstat(n)
	}
	r.ReadDir(".")
	r.Link("fifo", "fifo2")
	r.Rename("chr", "chr2")
	r.Lstat("fifo2")
	r.Lstat("chr2")
	r.Chmod("blk", 0o600)
	r.Lstat("blk")
	r.Truncate("fifo", 0)
	// The kernel opens a FIFO itself: both ends on this host.
	r.Open("rd", "fifo", rdonly|syscall.O_NONBLOCK, 0)
	r.Open("wr", "fifo", wronly, 0)
	r.Write("wr", []byte("through the pipe"))
	r.Read("rd", 64)
	r.Close("wr")
	r.Close("rd")
	r.Unlink("fifo")
	r.Lstat("fifo2")
	for _, n := range []string{"fifo2", "sock", "chr2", "blk", "reg"} {
		r.Unlink(n)
	}
	r.ReadDir(".")
}

// dirent is one getdents64 record: its name and offset (d_off).
type dirent struct {
	name string
	off  int64
}

// getdents reads directory fd from its offset to the end with a buffer of
// size bytes, or only one buffer's worth when once is set.
func getdents(fd, size int, once bool) ([]dirent, error) {
	var out []dirent
	buf := make([]byte, size)
	for {
		n, err := syscall.Getdents(fd, buf)
		if err != nil || n == 0 {
			return out, err
		}
		for p := 0; p < n; {
			// struct linux_dirent64: ino u64, off s64, reclen u16,
			// type u8, name NUL-terminated.
			b := buf[p:n]
			reclen := int(binary.LittleEndian.Uint16(b[16:]))
			nm, _, _ := strings.Cut(string(b[19:reclen]), "\x00")
			out = append(out, dirent{name: nm, off: int64(binary.LittleEndian.Uint64(b[8:]))})
			p += reclen
		}
		if once {
			return out, nil
		}
	}
}

// sortedNames renders a listing as the set it is (orders differ between
// file systems).
func sortedNames(ds []dirent) string {
	var ns []string
	for _, d := range ds {
		ns = append(ns, d.name)
	}
	slices.Sort(ns)
	return strings.Join(ns, " ")
}

// openFilledDir makes directory name with n empty files f0, f1, ... and
// opens it for reading; ok is false (and noted) when it cannot.
func (r *Rec) openFilledDir(name string, n int) (fd int, ok bool) {
	r.Mkdir(name, 0o755)
	for i := range n {
		r.WriteFile(name+"/f"+itoa(i), nil, 0o644)
	}
	fd, err := syscall.Open(filepath.Join(r.Dir, name), syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		r.Note("open %s: %s", name, errName(err))
		return 0, false
	}
	return fd, true
}

// rewinddirCase: rewinddir (lseek to 0) after the directory changed
// lists it as it is now.
func rewinddirCase(r *Rec) {
	fd, ok := r.openFilledDir("d", 12)
	if !ok {
		return
	}
	defer syscall.Close(fd)
	ds, err := getdents(fd, 4096, false)
	r.rec("listing", iff(err == nil, func() string { return sortedNames(ds) }), err)
	r.WriteFile("d/new", nil, 0o644)
	r.Unlink("d/f3")
	r.Rename("d/f4", "d/moved")
	r.Mkdir("d/sub", 0o755)
	_, err = syscall.Seek(fd, 0, 0)
	r.rec("rewinddir", "", err)
	ds, err = getdents(fd, 4096, false)
	r.rec("listing after rewinddir", iff(err == nil, func() string { return sortedNames(ds) }), err)
	// Partly read, changed, rewound.
	_, _ = syscall.Seek(fd, 0, 0)
	_, err = getdents(fd, 128, true)
	r.rec("partial read", "", err)
	r.Unlink("d/new")
	r.WriteFile("d/newer", nil, 0o644)
	_, err = syscall.Seek(fd, 0, 0)
	r.rec("rewinddir", "", err)
	ds, err = getdents(fd, 4096, false)
	r.rec("listing after rewinddir", iff(err == nil, func() string { return sortedNames(ds) }), err)
}

// seekdirCase: seekdir to an offset telldir returned continues the
// listing after the same entry, after entries were added and removed
// meanwhile: every entry that did not change and followed the offset
// comes again once, none that preceded it does.
func seekdirCase(r *Rec) {
	fd, ok := r.openFilledDir("d", 30)
	if !ok {
		return
	}
	defer syscall.Close(fd)
	first, err := getdents(fd, 256, true)
	if err != nil || len(first) < 4 {
		r.Note("first batch: %d entries, %v", len(first), err)
		return
	}
	pos := first[len(first)-1].off // telldir
	rest, err := getdents(fd, 4096, false)
	r.rec("whole listing", iff(err == nil, func() string { return itoa(len(first)+len(rest)) + " entries" }), err)
	changed := map[string]bool{"new1": true, "new2": true}
	for _, ds := range [][]dirent{first, rest} {
		for _, d := range ds[len(ds)-3:] {
			if d.name != "." && d.name != ".." && !changed[d.name] {
				changed[d.name] = true
				_ = syscall.Unlink(filepath.Join(r.Dir, "d", d.name))
				break
			}
		}
	}
	r.WriteFile("d/new1", nil, 0o644)
	r.WriteFile("d/new2", nil, 0o644)
	got, err := syscall.Seek(fd, pos, 0)
	r.rec("seekdir", iff(err == nil, func() string { return "at telldir's offset: " + boolStr(got == pos) }), err)
	again, err := getdents(fd, 4096, false)
	if err != nil {
		r.rec("listing after seekdir", "", err)
		return
	}
	seen := map[string]int{}
	for _, d := range again {
		seen[d.name]++
	}
	var wrong []string
	for _, d := range rest {
		if !changed[d.name] && seen[d.name] != 1 {
			wrong = append(wrong, d.name+" x"+itoa(seen[d.name]))
		}
	}
	for _, d := range first {
		if !changed[d.name] && seen[d.name] != 0 {
			wrong = append(wrong, d.name+" (before the offset) x"+itoa(seen[d.name]))
		}
	}
	slices.Sort(wrong)
	r.Note("listing after seekdir: unchanged entries wrong: [%s]", strings.Join(wrong, " "))
}

func boolStr(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// locks: flock and fcntl locks of one process. Its POSIX locks never
// conflict with each other, but flock locks and open file description
// locks belong to the open file, so two opens of one file conflict like
// two processes.
func locks(r *Rec) {
	r.WriteFile("f", []byte("locked"), 0o644)
	r.Open("a", "f", rdwr, 0)
	r.Open("b", "f", rdwr, 0)
	nb := syscall.LOCK_NB
	r.Flock("a", syscall.LOCK_EX|nb)
	r.Flock("b", syscall.LOCK_SH|nb)
	r.Flock("a", syscall.LOCK_SH|nb) // downgrade
	r.Flock("b", syscall.LOCK_SH|nb)
	r.Flock("a", syscall.LOCK_EX|nb) // a failed upgrade loses the lock
	r.Flock("b", syscall.LOCK_EX|nb)
	r.Flock("b", syscall.LOCK_UN)
	r.Flock("a", syscall.LOCK_EX|nb)
	r.Flock("a", syscall.LOCK_UN)

	// Open file description locks: ranges, conflicts, splits.
	r.SetLk("a", OFDSetLk, syscall.F_WRLCK, 0, 10)
	r.SetLk("b", OFDSetLk, syscall.F_RDLCK, 5, 1)
	r.GetLk("b", OFDGetLk, syscall.F_RDLCK, 0, 0)
	r.SetLk("b", OFDSetLk, syscall.F_WRLCK, 10, 0)
	r.GetLk("a", OFDGetLk, syscall.F_RDLCK, 100, 1)
	r.SetLk("a", OFDSetLk, syscall.F_UNLCK, 3, 2)
	r.SetLk("b", OFDSetLk, syscall.F_RDLCK, 3, 2)
	r.GetLk("b", OFDGetLk, syscall.F_WRLCK, 0, 5)
	r.GetLk("b", OFDGetLk, syscall.F_WRLCK, 5, 5)
	r.SetLk("a", OFDSetLk, syscall.F_UNLCK, 0, 0)
	r.SetLk("b", OFDSetLk, syscall.F_UNLCK, 0, 0)
	r.GetLk("a", OFDGetLk, syscall.F_WRLCK, 0, 0)

	// The process's own record locks, seen by an open file description,
	// and released by the close of any of its descriptors of the file.
	r.SetLk("a", syscall.F_SETLK, syscall.F_WRLCK, 0, 4)
	r.SetLk("b", syscall.F_SETLK, syscall.F_RDLCK, 2, 4) // same process: replaces
	r.GetLk("a", syscall.F_GETLK, syscall.F_WRLCK, 0, 0)
	r.Open("c", "f", rdwr, 0)
	r.GetLk("c", OFDGetLk, syscall.F_WRLCK, 0, 0)
	r.SetLk("c", OFDSetLk, syscall.F_RDLCK, 0, 1)
	r.SetLk("c", OFDSetLk, syscall.F_WRLCK, 0, 1)
	r.Close("b")
	r.GetLk("c", OFDGetLk, syscall.F_WRLCK, 0, 0)
	r.SetLk("c", OFDSetLk, syscall.F_WRLCK, 0, 0)
	r.Close("a")
	r.GetLk("c", OFDGetLk, syscall.F_WRLCK, 0, 0)
	r.Close("c")
	r.Unlink("f")
}
