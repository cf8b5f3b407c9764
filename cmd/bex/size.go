package main

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// byteSize is a flag of a size in bytes: a plain number, or a quantity such as
// 100MiB, 100Mi, 1GiB or 500M (k8s quantity syntax; KiB, MiB, GiB, TiB also read
// as the binary units).
type byteSize int64

func (b *byteSize) String() string {
	n := int64(*b)
	for _, u := range []struct {
		suffix string
		size   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.size && n%u.size == 0 {
			return fmt.Sprintf("%d%s", n/u.size, u.suffix)
		}
	}
	return fmt.Sprintf("%d", n)
}

func (b *byteSize) Set(s string) error {
	v := strings.TrimSpace(s)
	for _, u := range []string{"Ki", "Mi", "Gi", "Ti"} {
		v = strings.Replace(v, u+"B", u, 1)
	}
	q, err := resource.ParseQuantity(v)
	if err != nil || q.Sign() <= 0 {
		return fmt.Errorf("%q is not a positive size: give bytes or a unit, e.g. 100MiB or 1GiB", s)
	}
	n, ok := q.AsInt64()
	if !ok {
		return fmt.Errorf("%q is too large", s)
	}
	*b = byteSize(n)
	return nil
}

func (b *byteSize) Type() string { return "size" }
