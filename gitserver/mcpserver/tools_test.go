package mcpserver

import (
	"fmt"
	"strings"
	"testing"
)

func TestTailBufferKeepsWholeLastLines(t *testing.T) {
	b := tailBuffer{max: 100}
	for i := range 1000 {
		fmt.Fprintf(&b, "line %04d\n", i)
	}
	got := b.String()
	if !b.cut || len(got) > 100 || !strings.HasPrefix(got, "line ") || !strings.HasSuffix(got, "line 0999\n") {
		t.Fatalf("tail %q (cut %v)", got, b.cut)
	}
	small := tailBuffer{max: 100}
	small.Write([]byte("a\nb\n"))
	if small.String() != "a\nb\n" || small.cut {
		t.Fatalf("a short log is kept whole: %q", small.String())
	}
}
