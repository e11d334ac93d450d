"""Operations composed from the store and format layers; they return values and print nothing."""
