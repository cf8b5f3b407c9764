package main

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
)

// parseMemory reads a memory size flag as Kubernetes writes quantities: 4Gi, 512Mi,
// 4G or a number of bytes. Empty is 0.
func parseMemory(flag, s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	q, err := resource.ParseQuantity(s)
	if err != nil || q.Sign() <= 0 {
		return 0, fmt.Errorf("%s %q: give a size such as 4Gi or 512Mi", flag, s)
	}
	n, ok := q.AsInt64()
	if !ok || n < 1<<20 {
		return 0, fmt.Errorf("%s %q: give a size of at least 1Mi, such as 4Gi or 512Mi", flag, s)
	}
	return n, nil
}
