package client

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"

	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/memoryfs/memfs/memfspb"
)

// errnoErr returns the errno of a failed result as an error. Errno values
// on the wire are Linux's, which syscall.Errno is on Linux.
func errnoErr(res *pb.Result) error {
	if res.GetErrno() == 0 {
		return nil
	}
	return syscall.Errno(res.GetErrno())
}

// pathErr wraps err (nil stays nil) with the operation and the path, as
// the os package does, so errors.Is(err, fs.ErrNotExist) and friends work.
func pathErr(op, name string, err error) error {
	if err == nil {
		return nil
	}
	return &fs.PathError{Op: op, Path: name, Err: err}
}

func linkErr(op, oldname, newname string, err error) error {
	if err == nil {
		return nil
	}
	return &os.LinkError{Op: op, Old: oldname, New: newname, Err: err}
}

// Errno is the one place where an error of this package becomes the errno
// a system call returns, for callers that must answer with one (the FUSE
// mount, the test workloads):
//
//   - nil is 0;
//   - a syscall.Errno anywhere in the chain is kept (the cluster reports
//     POSIX errnos end to end), except 0, which is never success here;
//   - a closed file is EBADF;
//   - a cancelled call is EINTR;
//   - a call that ran out of its time is EIO: the cluster could not be
//     reached, which a program reading a file knows as a failed device
//     (an NFS mount answers the same); errors.Is(err,
//     context.DeadlineExceeded) still tells a Go caller why;
//   - the io/fs sentinel errors get their usual errnos;
//   - anything else is EIO.
func Errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if errno := syscall.Errno(0); errors.As(err, &errno) {
		if errno == 0 {
			return syscall.EIO
		}
		return errno
	}
	switch {
	case errors.Is(err, fs.ErrClosed):
		return syscall.EBADF
	case errors.Is(err, context.Canceled):
		return syscall.EINTR
	case errors.Is(err, context.DeadlineExceeded):
		return syscall.EIO
	case errors.Is(err, fs.ErrNotExist):
		return syscall.ENOENT
	case errors.Is(err, fs.ErrExist):
		return syscall.EEXIST
	case errors.Is(err, fs.ErrPermission):
		return syscall.EACCES
	case errors.Is(err, fs.ErrInvalid):
		return syscall.EINVAL
	}
	return syscall.EIO
}

// locName describes a Loc for error messages: its path, or "#parent/name",
// or "#ino".
func locName(l *pb.Loc) string {
	switch {
	case l.GetPath() != "":
		return l.GetPath()
	case l.GetName() != "":
		return "#" + strconv.FormatUint(l.GetParent(), 10) + "/" + l.GetName()
	default:
		return "#" + strconv.FormatUint(l.GetIno(), 10)
	}
}

// opName names a command for error messages and logs: its field in the
// Command oneof, as "setattr" for set_attr.
func opName(cmd *pb.Command) string {
	return oneofName(cmd.ProtoReflect(), "op", "command")
}

// oneofName is the name of the field set in m's oneof, without its
// underscores, or none when no field is set.
func oneofName(m protoreflect.Message, oneof protoreflect.Name, none string) string {
	fd := m.WhichOneof(m.Descriptor().Oneofs().ByName(oneof))
	if fd == nil {
		return none
	}
	return strings.ReplaceAll(string(fd.Name()), "_", "")
}

// cmdLoc returns the file a command is about, for error messages.
func cmdLoc(cmd *pb.Command) *pb.Loc {
	switch op := cmd.GetOp().(type) {
	case *pb.Command_Open:
		return op.Open.GetLoc()
	case *pb.Command_Write:
		return op.Write.GetLoc()
	case *pb.Command_Mkdir:
		return op.Mkdir.GetLoc()
	case *pb.Command_Remove:
		return op.Remove.GetLoc()
	case *pb.Command_Rename:
		return op.Rename.GetSrc()
	case *pb.Command_SetAttr:
		return op.SetAttr.GetLoc()
	case *pb.Command_Symlink:
		return op.Symlink.GetLoc()
	case *pb.Command_Link:
		return op.Link.GetDst()
	case *pb.Command_SetXattr:
		return op.SetXattr.GetLoc()
	case *pb.Command_RemoveXattr:
		return op.RemoveXattr.GetLoc()
	case *pb.Command_Clone:
		return op.Clone.GetDst()
	case *pb.Command_Lock:
		return &pb.Loc{Ino: op.Lock.GetIno()}
	}
	return nil
}

// queryName names a query for error messages, as opName does a command,
// and gives the file it is about.
func queryName(q *pb.Query) (string, *pb.Loc) {
	name := oneofName(q.ProtoReflect(), "q", "query")
	switch v := q.GetQ().(type) {
	case *pb.Query_Stat:
		return name, v.Stat.GetLoc()
	case *pb.Query_Read:
		return name, v.Read.GetLoc()
	case *pb.Query_ReadDir:
		return name, v.ReadDir.GetLoc()
	case *pb.Query_Readlink:
		return name, v.Readlink.GetLoc()
	case *pb.Query_GetXattr:
		return name, v.GetXattr.GetLoc()
	case *pb.Query_ListXattr:
		return name, v.ListXattr.GetLoc()
	case *pb.Query_Usage:
		return name, v.Usage.GetLoc()
	case *pb.Query_Lock:
		return name, &pb.Loc{Ino: v.Lock.GetIno()}
	case *pb.Query_Seek:
		return name, v.Seek.GetLoc()
	}
	return name, nil
}
