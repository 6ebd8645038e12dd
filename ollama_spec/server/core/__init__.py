"""What both APIs share: the server's state, request building, the one streaming driver, framing."""
