"""What several features of the window draw with: the theme, eliding, a wrapping layout, a tree as high as its rows."""
