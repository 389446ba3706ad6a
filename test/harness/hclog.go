package harness

import (
	"io"
	"os"

	"github.com/hashicorp/go-hclog"
)

// quietHclog is the logger of the Raft transports the harness builds: the
// faults make them complain constantly, so only MEMFS_TEST_RAFT_LOG shows
// them.
func quietHclog() hclog.Logger {
	level := os.Getenv("MEMFS_TEST_RAFT_LOG")
	if level == "" {
		return hclog.New(&hclog.LoggerOptions{Output: io.Discard, Level: hclog.Off})
	}
	return hclog.New(&hclog.LoggerOptions{Name: "raft-net", Output: os.Stderr, Level: hclog.LevelFromString(level)})
}
