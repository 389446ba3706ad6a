package region

// SetBeforeUnmap makes fn run before a region's memory is unmapped, until
// the test ends.
func SetBeforeUnmap(t interface{ Cleanup(func()) }, fn func()) {
	beforeUnmap = fn
	t.Cleanup(func() { beforeUnmap = nil })
}
