package procs

import "testing"

// FreeAddr never hands out one address twice in a process, though the kernel may give a
// port just closed again.
func TestFreeAddrNeverTwice(t *testing.T) {
	seen := map[string]bool{}
	for range 300 {
		addr, err := FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		if seen[addr] {
			t.Fatalf("%s handed out twice", addr)
		}
		seen[addr] = true
	}
}
