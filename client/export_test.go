package client

// SetStreamLimit lowers the most data one write command carries, so tests
// can exercise splitting with little data. It returns a function that
// restores the limit.
func SetStreamLimit(n int) (restore func()) {
	old := streamLimit
	streamLimit = n
	return func() { streamLimit = old }
}
