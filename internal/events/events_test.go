package events

import "testing"

func TestBroker(t *testing.T) {
	b := NewBroker(3)
	for i := range 5 {
		b.Publish(Event{Kind: KindHealth, Farm: "f", Backend: string(rune('a' + i))})
	}
	recent := b.Recent()
	if len(recent) != 3 || recent[0].ID != 3 || recent[2].ID != 5 {
		t.Fatalf("recent %+v", recent)
	}
	// A subscriber after id 3 first gets 4 and 5, then new ones.
	s := b.Subscribe(3, 2)
	defer b.Cancel(s)
	if ev := <-s.C; ev.ID != 4 {
		t.Errorf("first %d", ev.ID)
	}
	if ev := <-s.C; ev.ID != 5 {
		t.Errorf("second %d", ev.ID)
	}
	// A slow subscriber loses events, and is told how many.
	for range 4 {
		b.Publish(Event{Kind: KindQuorum})
	}
	if n := s.Dropped(); n != 1 {
		t.Errorf("dropped %d, want 1 (buffer of 3)", n)
	}
	if s.Dropped() != 0 {
		t.Error("Dropped does not reset")
	}
	// Subscribe(0) replays nothing.
	s2 := b.Subscribe(0, 1)
	defer b.Cancel(s2)
	select {
	case ev := <-s2.C:
		t.Errorf("replayed %+v", ev)
	default:
	}
}
