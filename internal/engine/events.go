package engine

import "github.com/xlb-lb/xlb/internal/events"

// Events returns the broker the engine publishes health events to (nil
// before SetEvents): what follows health beside the API, such as the BGP
// announcer, subscribes to it.
func (e *Engine) Events() *events.Broker { return e.health.events }
