package fsops

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	pb "github.com/memoryfs/memfs/memfspb"
)

// TestRelatime: with Relatime, the first read after a change moves atime
// (in the background), later reads send nothing, and a change makes the
// next read count again; without it, reads leave atime alone.
func TestRelatime(t *testing.T) {
	for _, relatime := range []bool{true, false} {
		t.Run(map[bool]string{true: "relatime", false: "noatime"}[relatime], func(t *testing.T) {
			ops, other := newOps(t, Options{Relatime: relatime})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go ops.Watch(ctx, &recorder{data: map[uint64]int{}, entries: map[string]int{}})
			require.Eventually(t, ops.Watching, 10*time.Second, time.Millisecond)
			a, out, e := ops.Create(ctx, RootIno, "f", syscall.O_RDWR, 0o644, root)
			require.Zero(t, e)
			_, e = ops.Write(ctx, a.Ino, out.Handle, 0, []byte("hello"))
			require.Zero(t, e)
			require.Zero(t, ops.Release(ctx, a.Ino, out.Handle))
			stat := func() *pb.Attr {
				st, err := other.Stat("/f")
				require.NoError(t, err)
				return st.Sys().(*pb.Attr)
			}
			first := stat()

			read := func() {
				in, e := ops.Open(ctx, a.Ino, syscall.O_RDONLY, root)
				require.Zero(t, e)
				buf := make([]byte, 16)
				_, e = ops.Read(ctx, a.Ino, in.Handle, 0, buf)
				require.Zero(t, e)
				require.Zero(t, ops.Release(ctx, a.Ino, in.Handle))
			}
			read()
			if !relatime {
				time.Sleep(200 * time.Millisecond) // what a background access would take
				require.Equal(t, first.AtimeNs, stat().AtimeNs)
				return
			}
			require.Eventually(t, func() bool { return stat().AtimeNs > first.MtimeNs }, 10*time.Second, 5*time.Millisecond)
			moved := stat()
			require.Equal(t, first.CtimeNs, moved.CtimeNs, "an access is no change")

			// Nothing changed: another read sends nothing after it.
			read()
			calls := ops.c.Calls()
			require.Never(t, func() bool { return ops.c.Calls() != calls }, 200*time.Millisecond, 10*time.Millisecond)

			// Another session writes: the next read is an access again.
			_, _, err := other.WriteIno(ctx, a.Ino, 0, []byte("H"))
			require.NoError(t, err)
			changed := stat()
			require.Eventually(t, func() bool {
				read()
				return stat().AtimeNs > changed.MtimeNs
			}, 10*time.Second, 20*time.Millisecond)
		})
	}
}
