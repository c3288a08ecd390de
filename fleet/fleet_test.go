package fleet

import "testing"

func TestServiceFor(t *testing.T) {
	named := []Service{{Name: "a", Models: []string{"m1"}}, {Name: "b", Models: []string{"m2", "m1"}}}
	for _, tc := range []struct {
		services []Service
		model    string
		want     int
	}{
		{named, "m1", 0}, // the first that lists it, in the given order
		{named, "m2", 1},
		{named, "nope", -1},
		{[]Service{{Name: "only"}}, "anything", 0}, // a lone service that named no model claims it
		{[]Service{{Name: "x"}, {Name: "y"}}, "anything", -1},
		{append([]Service{{Name: "unnamed"}}, named...), "nope", -1},
		{nil, "m", -1},
	} {
		if got := ServiceFor(tc.services, tc.model); got != tc.want {
			t.Errorf("ServiceFor(%v, %q) = %d; want %d", tc.services, tc.model, got, tc.want)
		}
	}
}
