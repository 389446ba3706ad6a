package bazilfs

import (
	"encoding/binary"
	"os"
	"reflect"
	"syscall"
	"time"
	"unsafe"

	"bazil.org/fuse"

	"github.com/memoryfs/memfs/fuse/fsops"
)

// bazil.org/fuse encodes a mode with only its permission bits and S_ISUID
// and S_ISGID: S_ISVTX never reaches the kernel through its responses, so
// stat on a sticky directory or file shows no sticky bit. The binding
// answers the GETATTR of such an inode itself, with a reply of the
// kernel's own format (include/uapi/linux/fuse.h: fuse_out_header, then
// fuse_attr_out) written to the connection's device before bazil writes
// its own, which the kernel then refuses (ENOENT: the request is already
// answered; request IDs are never reused). Every other answer carrying the
// inode's attributes (lookup, setattr, create) comes from bazil without
// the bit, so they are given no attribute validity: the kernel asks again
// with GETATTR at the next stat.
//
// The device is bazil's Conn.dev, an unexported field read by reflection;
// when a bazil version lacks it, the replies go through bazil and the bit
// stays unseen, as documented.

// devOf returns the FUSE device file of conn, or nil.
func devOf(conn *fuse.Conn) *os.File {
	if conn == nil {
		return nil
	}
	v := reflect.ValueOf(conn).Elem().FieldByName("dev")
	if !v.IsValid() || v.Type() != reflect.TypeOf((*os.File)(nil)) || !v.CanAddr() {
		return nil
	}
	return *(**os.File)(unsafe.Pointer(v.UnsafeAddr()))
}

// Sizes of the kernel's structures (protocol 7.9 and later; bazil asks
// for at least 7.17).
const (
	outHeaderSize = 16
	attrOutSize   = 16 + 88
)

// stickyAttrReply encodes the answer to GETATTR request id: a, valid for
// no time.
func stickyAttrReply(id fuse.RequestID, a fsops.Attr, blksize uint32) []byte {
	b := make([]byte, outHeaderSize+attrOutSize)
	le := binary.NativeEndian
	le.PutUint32(b[0:], uint32(len(b)))
	le.PutUint32(b[4:], 0) // error
	le.PutUint64(b[8:], uint64(id))
	p := b[outHeaderSize:]
	// attr_valid, attr_valid_nsec, dummy: zero
	at := p[16:]
	sec := func(t time.Time) (uint64, uint32) {
		if t.IsZero() {
			return 0, 0
		}
		return uint64(t.Unix()), uint32(t.Nanosecond())
	}
	le.PutUint64(at[0:], a.Ino)
	le.PutUint64(at[8:], a.Size)
	le.PutUint64(at[16:], a.Blocks)
	as, an := sec(a.Atime)
	ms, mn := sec(a.Mtime)
	cs, cn := sec(a.Ctime)
	le.PutUint64(at[24:], as)
	le.PutUint64(at[32:], ms)
	le.PutUint64(at[40:], cs)
	le.PutUint32(at[48:], an)
	le.PutUint32(at[52:], mn)
	le.PutUint32(at[56:], cn)
	le.PutUint32(at[60:], a.Mode)
	le.PutUint32(at[64:], a.Nlink)
	le.PutUint32(at[68:], a.Uid)
	le.PutUint32(at[72:], a.Gid)
	le.PutUint32(at[76:], a.Rdev)
	le.PutUint32(at[80:], blksize)
	// flags: zero
	return b
}

// answerSticky answers GETATTR request id with a when a carries S_ISVTX
// and the device is known; it reports whether it did.
func (f *FS) answerSticky(id fuse.RequestID, a fsops.Attr) bool {
	dev := f.dev.Load()
	if a.Mode&syscall.S_ISVTX == 0 || dev == nil {
		return false
	}
	msg := stickyAttrReply(id, a, MaxIO)
	n, err := syscall.Write(int(dev.Fd()), msg)
	return err == nil && n == len(msg)
}
