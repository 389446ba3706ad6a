package fsops

import (
	"context"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Every method of the wrapped Ops must recover and report: an Ops whose
// methods all panic (a nil embedded interface) is called through Wrap by
// reflection, method by method; one that Wrap does not cover panics the
// test.
func TestWrapCoversEveryOperation(t *testing.T) {
	var seen []string
	w := reflect.ValueOf(Wrap(struct{ Ops }{}, func(op string, _ time.Time, e syscall.Errno) {
		require.Equal(t, syscall.EIO, e, op)
		seen = append(seen, op)
	}))
	ops := reflect.TypeFor[Ops]()
	ctxType := reflect.TypeFor[context.Context]()
	for i := range ops.NumMethod() {
		name := ops.Method(i).Name
		m := w.MethodByName(name)
		args := make([]reflect.Value, m.Type().NumIn())
		for j := range args {
			args[j] = reflect.Zero(m.Type().In(j))
			if m.Type().In(j) == ctxType {
				args[j] = reflect.ValueOf(context.Background())
			}
		}
		out := m.Call(args)
		require.Equal(t, syscall.EIO, out[len(out)-1].Interface(), name)
		require.Equal(t, strings.ToLower(name), seen[len(seen)-1], "observed op of %s", name)
	}
	require.Len(t, seen, ops.NumMethod())
}
