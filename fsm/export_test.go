package fsm

import "slices"

// CapHolders returns, for the published state, the sessions holding a
// capability on an inode that are still in force at log time now (their
// session not expired, the capability not due for revocation).
func (f *FSM) CapHolders(now int64) func(ino uint64) []uint64 {
	s := f.cur.Load()
	return func(ino uint64) []uint64 {
		var out []uint64
		for _, c := range s.capsOf(ino) {
			sess := s.session(c.session)
			if sess == nil || sess.expires <= now || (c.revokeAt != 0 && c.revokeAt <= now) {
				continue
			}
			out = append(out, c.session)
		}
		slices.Sort(out)
		return out
	}
}

// CapCount is the number of capabilities held.
func (f *FSM) CapCount() uint64 { return f.cur.Load().ncaps }
