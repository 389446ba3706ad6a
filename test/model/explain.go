package model

import (
	"fmt"
	"sort"
	"strings"

	"github.com/anishathalye/porcupine"
)

// Explain describes where a history stops being linearizable: for each
// key whose operations cannot be linearized, the longest order porcupine
// found, the state it leads to, and the operations that could not come
// next. It returns "" for a linearizable history.
func Explain(ops []porcupine.Operation) string {
	m := FS()
	res, info := porcupine.CheckOperationsVerbose(m, ops, CheckTimeout)
	switch res {
	case porcupine.Ok:
		return ""
	case porcupine.Unknown:
		return fmt.Sprintf("inconclusive: the check did not finish within %v\n", CheckTimeout)
	}
	var b strings.Builder
	parts := partition(ops)
	for p, lins := range info.PartialLinearizationsOperations() {
		if p >= len(parts) || len(parts[p]) == 0 ||
			porcupine.CheckOperationsTimeout(m, parts[p], CheckTimeout) != porcupine.Illegal {
			continue
		}
		key := parts[p][0].Input.(Input).Key
		best := longest(lins)
		fmt.Fprintf(&b, "key %s: %d operations, at most %d linearize\n", key, len(parts[p]), len(best))
		var state interface{}
		for _, op := range best {
			_, state = step(state, op.Input, op.Output)
		}
		tail := best
		if len(tail) > 8 {
			tail = tail[len(tail)-8:]
		}
		for _, op := range tail {
			fmt.Fprintf(&b, "  ... %s  [client %d, %d-%d]\n", Describe(op.Input.(Input), op.Output.(Output)), op.ClientId, op.Call, op.Return)
		}
		fmt.Fprintf(&b, "  state then: %s\n", describeState(state))
		for _, op := range stuck(parts[p], best) {
			fmt.Fprintf(&b, "  cannot follow: %s  [client %d, %d-%d]\n", Describe(op.Input.(Input), op.Output.(Output)), op.ClientId, op.Call, op.Return)
		}
	}
	return b.String()
}

func longest(lins [][]porcupine.Operation) []porcupine.Operation {
	var best []porcupine.Operation
	for _, l := range lins {
		if len(l) > len(best) {
			best = l
		}
	}
	return best
}

// stuck lists the operations not in lin that were invoked before the
// earliest return among them: the candidates for the next position, none of
// which fits.
func stuck(all, lin []porcupine.Operation) []porcupine.Operation {
	done := map[[2]int64]bool{}
	for _, op := range lin {
		done[[2]int64{op.Call, int64(op.ClientId)}] = true
	}
	var left []porcupine.Operation
	for _, op := range all {
		if !done[[2]int64{op.Call, int64(op.ClientId)}] {
			left = append(left, op)
		}
	}
	sort.Slice(left, func(i, j int) bool { return left[i].Call < left[j].Call })
	if len(left) == 0 {
		return nil
	}
	first := left[0].Return
	for _, op := range left {
		first = min(first, op.Return)
	}
	var out []porcupine.Operation
	for _, op := range left {
		if op.Call <= first && len(out) < 6 {
			out = append(out, op)
		}
	}
	return out
}
