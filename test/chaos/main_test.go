package chaos

import (
	"flag"
	"os"
	"testing"
)

// TestMain runs four clusters at a time unless -parallel says otherwise:
// the nodes mostly wait on fsync and timers, so two cores are far from
// busy with two.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", "4")
	}
	os.Exit(m.Run())
}
