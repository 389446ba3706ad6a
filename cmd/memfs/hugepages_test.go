package main

import (
	"context"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/client/replace"
)

// A node whose address space is capped (ulimit -v) starts and serves: it
// skips the huge page reservation, which under such a cap made the Go
// runtime abort the node at start ("out of memory").
func TestServerUnderAddressSpaceLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := memfsBinary(t)
	ports := freePorts(t, 2)
	out := &syncBuffer{}
	cmd := exec.Command("sh", "-c", `ulimit -v 4000000 && exec "$0" "$@"`, bin, "server",
		"--id", "a", "--ephemeral", "--bootstrap", "--raft-addr", ports[0], "--api-addr", ports[1], "--insecure")
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	exited := func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
	require.Eventually(t, func() bool {
		_, err := replace.LocalStatus(context.Background(), replace.Net{}, ports[1])
		return err == nil || exited()
	}, 30*time.Second, 50*time.Millisecond, "the node never answered: %s", out)
	require.False(t, exited(), "the node exited: %s", out)
	require.Contains(t, out.String(), "RLIMIT_AS or RLIMIT_DATA is set")
}
