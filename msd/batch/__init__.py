"""A batch's layout, pure numpy: ``sample`` what a sample carries besides its tokens (its images
and videos), ``pack`` one rank's packed rows as batch arrays, ``cp_slice`` the slices of them
each context-parallel rank receives."""
