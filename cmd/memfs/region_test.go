package main

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/memoryfs/memfs/server/servertest"
)

func TestRegionPullCommand(t *testing.T) {
	cluster := servertest.StartCluster(t, 3, servertest.WithEphemeral())
	m := cli{t: t, bin: memfsBinary(t), cluster: strings.Join(cluster.APIAddrs(), ",")}
	dir := t.TempDir()
	data := make([]byte, 3<<20+12345)
	rand.NewChaCha8([32]byte{7}).Read(data)
	src := filepath.Join(dir, "src")
	require.NoError(t, os.WriteFile(src, data, 0o644))
	m.ok("put", src, "/f")

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"region", nil, `(?m)^open .*, first byte .*, all .*: [0-9.]+MiB/s$`},
		{"plain", []string{"--plain"}, `(?m)^first byte .*, all .*: [0-9.]+MiB/s$`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(dir, tc.name)
			stdout := m.ok(append([]string{"region", "pull", "/f", "-o", out}, tc.args...)...)
			require.Regexp(t, regexp.MustCompile(tc.want), stdout)
			back, err := os.ReadFile(out)
			require.NoError(t, err)
			require.True(t, bytes.Equal(data, back), "the pulled file is the file")
		})
	}

	_, errOut, code := m.run("", "region", "pull", "/missing")
	require.NotZero(t, code)
	require.Contains(t, errOut, "no such file")
}

// TestRegionHandoffCommand: the demo hands a region back and forth under
// writes, and its checker passes; the file goes at the end.
func TestRegionHandoffCommand(t *testing.T) {
	cluster := servertest.StartCluster(t, 3, servertest.WithEphemeral())
	m := cli{t: t, bin: memfsBinary(t), cluster: strings.Join(cluster.APIAddrs(), ",")}
	out := m.ok("region", "handoff", "--path", "/h", "--size", "4MiB", "--hot", "512KiB", "--rounds", "3", "--settle", "50ms")
	require.Len(t, regexp.MustCompile(`(?m)^round [123]: pause `).FindAllString(out, -1), 3, out)
	require.Contains(t, out, "3 handoffs: no write lost or reordered")
	require.Regexp(t, `(?m)^pause p50 .*, p99 .*, max .*$`, out)
	_, _, code := m.run("", "stat", "/h")
	require.NotZero(t, code, "the demo's file is removed")
}
