package fsops

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAccessCheck(t *testing.T) {
	file := Attr{Mode: syscall.S_IFREG | 0o640, Uid: 10, Gid: 20}
	dir := Attr{Mode: syscall.S_IFDIR | 0o700, Uid: 10, Gid: 20}
	for _, tc := range []struct {
		name string
		a    Attr
		mask uint32
		c    Caller
		want syscall.Errno
	}{
		{"exists", file, 0, Caller{Uid: 99}, 0},
		{"owner reads and writes", file, 6, Caller{Uid: 10, Gid: 1}, 0},
		{"owner cannot execute", file, 1, Caller{Uid: 10}, syscall.EACCES},
		{"group reads", file, 4, Caller{Uid: 11, Gid: 20}, 0},
		{"group cannot write", file, 2, Caller{Uid: 11, Gid: 20}, syscall.EACCES},
		{"other nothing", file, 4, Caller{Uid: 12, Gid: 21}, syscall.EACCES},
		{"root reads anything", file, 6, Caller{}, 0},
		{"root cannot execute a non-executable file", file, 1, Caller{}, syscall.EACCES},
		{"root searches any directory", dir, 1, Caller{}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, accessCheck(tc.a, tc.mask, tc.c))
		})
	}
}
