"""Images in a chat, without a window: those waiting in the composer (pasted, dropped, chosen
with the paperclip) and the conversions between the store's images and the backends'."""
